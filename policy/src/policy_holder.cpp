#include "arbiter/policy_holder.h"

#include <utility>

namespace arbiter {

PolicyHolder::PolicyHolder(Policy initial) {
  versions_.push_back(std::make_unique<const Policy>(std::move(initial)));
  current_.store(versions_.back().get(), std::memory_order_release);
}

PolicyHolder::~PolicyHolder() = default;

ReloadResult PolicyHolder::reload(const LoadOptions& options) {
  // Loading runs outside the lock: a slow file system delays only this
  // writer, and a concurrent writer that publishes first is simply
  // superseded, as if it had been called earlier.
  LoadResult loaded = Policy::load(options);
  ReloadResult result;
  result.diagnostics = std::move(loaded.diagnostics);
  if (!loaded.policy) {
    result.generation = generation();
    return result;
  }
  result.generation = publish(*std::move(loaded.policy));
  result.published = true;
  return result;
}

std::uint64_t PolicyHolder::publish(Policy policy) {
  auto version = std::make_unique<const Policy>(std::move(policy));
  const Policy* fresh = version.get();
  std::lock_guard<std::mutex> lock(writer_);
  versions_.push_back(std::move(version));
  // The Policy is completely built before this store; the release pairs
  // with the acquire in current(), so a reader that sees the pointer sees
  // every table behind it.
  current_.store(fresh, std::memory_order_release);
  const std::uint64_t generation = generation_.load(std::memory_order_relaxed) + 1;
  generation_.store(generation, std::memory_order_release);
  return generation;
}

std::size_t PolicyHolder::retained_versions() const {
  std::lock_guard<std::mutex> lock(writer_);
  return versions_.size();
}

}  // namespace arbiter
