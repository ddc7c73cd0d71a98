# Writes OUTPUT, a C++ file defining `std::string_view NAME()` that returns
# the bytes of INPUT. Run at build time so edits to INPUT rebuild the library.
file(READ "${INPUT}" content HEX)
string(LENGTH "${content}" hex_length)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${content}")
math(EXPR length "${hex_length} / 2")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/embed_file.cmake. Do not edit.\n"
  "#include <string_view>\n"
  "namespace arbiter::detail {\n"
  "static const char kBytes[] = {${bytes} 0};\n"
  "std::string_view ${NAME}() { return {kBytes, ${length}}; }\n"
  "}  // namespace arbiter::detail\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
