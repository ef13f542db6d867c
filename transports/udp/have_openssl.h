// Whether this build has OpenSSL's libcrypto for the udp transport's authenticated mode:
// UCXB_HAVE_OPENSSL is 1 when <openssl/evp.h> is found (the build then links -lcrypto:
// setup.py and tests/cpp_build.py probe for the same header) and 0 otherwise, or when the
// build asked for none (-DUCXB_WITHOUT_OPENSSL, to test that build). Decided from the header
// itself rather than from a flag on every unit, so that adding OpenSSL to a machine only
// recompiles the units that use it.
#pragma once

#if defined(UCXB_WITHOUT_OPENSSL)
#define UCXB_HAVE_OPENSSL 0
#elif defined(__has_include)
#if __has_include(<openssl/evp.h>)
#define UCXB_HAVE_OPENSSL 1
#else
#define UCXB_HAVE_OPENSSL 0
#endif
#else
#define UCXB_HAVE_OPENSSL 0
#endif
