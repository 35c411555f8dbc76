/* vmmweights.h compiles alone, as C and as C++, with warnings as errors. */
#include "vmmweights.h"

int vmmw_header_alone_c(void);
int vmmw_header_alone_c(void) { return VMMW_OK + VMMW_VERSION_MAJOR * 0; }
