// The kernels of kernels.h as a plain C ABI, for ctypes (hvdcompress/ops/native.py): no Python,
// torch or TensorFlow header, so the library builds and loads without any framework.
//
// Nothing here is written per kernel: every kernel listed in HVDC_KERNELS (kernels.h) gets a C
// function generated from its C++ signature, and hvdc_kernels() lists them by name with their
// argument types, from which native.py builds the ctypes signatures.
//
// A generated function takes the kernel's arguments, then, for a kernel that returns a value, a
// pointer the value is written through. It returns 0 on success; on a C++ exception it returns 1
// (std::invalid_argument), 2 (std::out_of_range) or 3 (anything else), writes nothing, and
// hvdc_error() gives the message (per thread). Argument rules (sizes, dtypes) are checked by the
// caller; semantics are those of kernels.h.
#include <exception>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace {

thread_local std::string last_error;

template <class F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::invalid_argument& e) {
    last_error = e.what();
    return 1;
  } catch (const std::out_of_range& e) {
    last_error = e.what();
    return 2;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 3;
  }
}

// An argument type's code, a letter of Python's struct module ('P': any pointer). Only these
// types may appear in a kernel's signature: another one does not compile.
template <class T> struct Code;
template <class T> struct Code<T*> { static constexpr char value = 'P'; };
template <> struct Code<bool> { static constexpr char value = '?'; };
template <> struct Code<int> { static constexpr char value = 'i'; };
template <> struct Code<uint32_t> { static constexpr char value = 'I'; };
template <> struct Code<int64_t> { static constexpr char value = 'q'; };
template <> struct Code<float> { static constexpr char value = 'f'; };
template <> struct Code<double> { static constexpr char value = 'd'; };

// The C function of kernel F (call) and its argument codes (signature): for a kernel that returns
// a value, then '>' and the value's code (the call takes a pointer to it last).
template <auto F, class Signature = decltype(F)> struct Export;

template <auto F, class R, class... A>
struct Export<F, R (*)(A...)> {
  static int call(A... a, R* result) {
    return guarded([&] { *result = F(a...); });
  }
  static constexpr char signature[] = {Code<A>::value..., '>', Code<R>::value, '\0'};
};

template <auto F, class... A>
struct Export<F, void (*)(A...)> {
  static int call(A... a) {
    return guarded([&] { F(a...); });
  }
  static constexpr char signature[] = {Code<A>::value..., '\0'};
};

}  // namespace

extern "C" {

struct hvdc_kernel {
  const char* name;
  const char* signature;  // argument codes, see Code and Export
  void* function;         // int (*)(arguments as the signature says)
};

#define HVDC_ENTRY(name) \
  {#name, Export<&hvdc::name>::signature, reinterpret_cast<void*>(&Export<&hvdc::name>::call)},

static const hvdc_kernel kernels[] = {HVDC_KERNELS(HVDC_ENTRY)};

const char* hvdc_error() { return last_error.c_str(); }

// The exported kernels: writes their number to *count and returns the first.
const hvdc_kernel* hvdc_kernels(int64_t* count) {
  *count = sizeof(kernels) / sizeof(kernels[0]);
  return kernels;
}

}  // extern "C"
