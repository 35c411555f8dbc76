/* Minimal assertion helpers for the C ABI tests (compiled as C and as C++). */
#ifndef VMMW_TEST_CHECK_H
#define VMMW_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmmweights_testing.h" /* vmmweights.h and the host backend's testing hooks */

static int g_checks = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    ++g_checks;                                                                  \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

/* Expect status `want` from `call`; print the error message when it differs. */
#define CHECK_STATUS(want, call)                                                 \
  do {                                                                           \
    vmmw_error_t* check_err_ = NULL;                                             \
    vmmw_status_t check_rc_ = (call);                                                  \
    (void)check_err_;                                                            \
    ++g_checks;                                                                  \
    if (check_rc_ != (want)) {                                                   \
      fprintf(stderr, "%s:%d: %s returned %s, want %s\n", __FILE__, __LINE__,    \
              #call, vmmw_status_name(check_rc_), vmmw_status_name(want));       \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

/* Run `call` with an error out-argument named `err`; require VMMW_OK. */
#define CHECK_OK(call)                                                           \
  do {                                                                           \
    vmmw_error_t* err = NULL;                                                    \
    vmmw_status_t check_rc_ = (call);                                                  \
    ++g_checks;                                                                  \
    if (check_rc_ != VMMW_OK) {                                                  \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,   \
              vmmw_status_name(check_rc_), vmmw_error_message(err));             \
      vmmw_error_free(err);                                                      \
      exit(1);                                                                   \
    }                                                                            \
    CHECK(err == NULL);                                                          \
  } while (0)

#endif
