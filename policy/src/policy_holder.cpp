#include "arbiter/policy_holder.h"

#include <utility>

namespace arbiter {

PolicyHolder::PolicyHolder(Policy initial) {
  versions_.push_back(std::make_unique<const Policy>(std::move(initial)));
  current_.store(versions_.back().get(), std::memory_order_release);
}

PolicyHolder::~PolicyHolder() = default;

ReloadResult PolicyHolder::reload(const LoadOptions& options) {
  // The ticket is taken before the files are read: a reload that began
  // later read them later, so its tables win whichever load finishes first.
  const std::uint64_t ticket = tickets_.fetch_add(1, std::memory_order_relaxed) + 1;
  // Loading runs outside the lock: a slow file system delays only this
  // writer.
  LoadResult loaded = Policy::load(options);
  ReloadResult result;
  result.diagnostics = std::move(loaded.diagnostics);
  if (!loaded.policy) {
    result.generation = generation();
    return result;
  }
  const std::optional<std::uint64_t> generation = install(*std::move(loaded.policy), ticket);
  result.published = generation.has_value();
  result.superseded = !generation;
  result.generation = generation ? *generation : this->generation();
  return result;
}

std::uint64_t PolicyHolder::publish(Policy policy) {
  // Its ticket is taken under the lock (install()): newer than any tables
  // installed, so never superseded.
  return *install(std::move(policy), std::nullopt);
}

std::optional<std::uint64_t> PolicyHolder::install(Policy policy,
                                                   std::optional<std::uint64_t> ticket) {
  auto version = std::make_unique<const Policy>(std::move(policy));
  const Policy* fresh = version.get();
  std::lock_guard<std::mutex> lock(writer_);
  if (!ticket) ticket = tickets_.fetch_add(1, std::memory_order_relaxed) + 1;
  // A writer that began later has published: these tables, read earlier,
  // would put stale ones back.
  if (*ticket < installed_ticket_) return std::nullopt;
  installed_ticket_ = *ticket;
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
