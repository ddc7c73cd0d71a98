# Writes OUTPUT, a C++ file defining arbiter::detail::embedded_preset_table(),
# the name (file name without .yaml) and bytes of each of FILES ('|'-separated),
# sorted by name. Run at build time so edits to a preset rebuild the library.
string(REPLACE "|" ";" files "${FILES}")
list(SORT files)
set(arrays "")
set(entries "")
set(index 0)
foreach(file IN LISTS files)
  get_filename_component(name "${file}" NAME_WE)
  file(READ "${file}" content HEX)
  string(LENGTH "${content}" hex_length)
  math(EXPR length "${hex_length} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${content}")
  string(APPEND arrays "static const char kPreset${index}[] = {${bytes} 0};\n")
  string(APPEND entries "    {\"${name}\", {kPreset${index}, ${length}}},\n")
  math(EXPR index "${index} + 1")
endforeach()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from configs/presets/ by cmake/embed_presets.cmake. Do not edit.\n"
  "#include <cstddef>\n"
  "#include <string_view>\n"
  "namespace arbiter::detail {\n"
  "struct EmbeddedPreset {\n"
  "  std::string_view name;\n"
  "  std::string_view bytes;\n"
  "};\n"
  "${arrays}"
  "static const EmbeddedPreset kPresets[] = {\n${entries}    {{}, {}}};\n"
  "const EmbeddedPreset* embedded_preset_table(std::size_t* count) {\n"
  "  *count = ${index};\n"
  "  return kPresets;\n"
  "}\n"
  "}  // namespace arbiter::detail\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
