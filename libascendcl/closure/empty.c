/* A library of the closure that frameworks link but whose functions they never call (api/closure.json):
 * it only has to exist under its SONAME. */
typedef int flexnpu_empty_library;
