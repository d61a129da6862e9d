// Under AddressSanitizer (the asan preset, the fuzz targets), an allocation no host could
// satisfy returns null as it does without ASan, so that the tests see cleave's own error
// instead of ASan's report.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
