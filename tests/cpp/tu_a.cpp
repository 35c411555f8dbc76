// First of two translation units including vmmweights.hpp: together they prove
// the header-only wrapper has no ODR violations (everything inline).
#include "vmmweights.hpp"

uint64_t granularity_from_tu_a(const vmmw::Device& d);
uint64_t granularity_from_tu_a(const vmmw::Device& d) { return d.granularity(); }
