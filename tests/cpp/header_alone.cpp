// vmmweights.hpp compiles alone (no other include before it).
#include "vmmweights.hpp"

int vmmw_header_alone_cpp();
int vmmw_header_alone_cpp() { return vmmw::Error(VMMW_IO, "x").status(); }
