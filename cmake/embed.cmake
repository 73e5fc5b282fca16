# Turns a binary file into a C++ source defining a byte array:
#   cmake -DINPUT=file -DOUTPUT=file.cpp -DSYMBOL=name -P embed.cmake
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}"
  "// Generated from ${INPUT} by cmake/embed.cmake. Do not edit.\n"
  "#include <cstddef>\n"
  "#include <cstdint>\n"
  "namespace lockstep::embedded {\n"
  "extern const uint8_t ${SYMBOL}[] = {${bytes}};\n"
  "extern const size_t ${SYMBOL}_size = ${size};\n"
  "}\n")
