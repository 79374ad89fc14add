// A tensor over memory Sluice owns, with a deleter: libtorch calls `drop(ctx)` when the
// tensor's storage dies (the last tensor or view sharing it is freed), so the Arrow buffer
// behind it lives exactly as long as any tensor can read it. tch 0.26's `from_blob` takes
// no deleter, hence this shim.
#include <ATen/ATen.h>

extern "C" void *sluice_tensor_of_blob(void *data, const int64_t *dims, size_t ndims,
                                       int scalar_type, void *ctx, void (*drop)(void *)) {
    try {
        at::Tensor t = at::from_blob(
            data, at::IntArrayRef(dims, ndims), [ctx, drop](void *) { drop(ctx); },
            at::TensorOptions().dtype(static_cast<at::ScalarType>(scalar_type)));
        return new at::Tensor(std::move(t));
    } catch (...) {
        drop(ctx);
        return nullptr;
    }
}
