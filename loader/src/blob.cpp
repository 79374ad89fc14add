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

// Copies on a side stream (CUDA only; compiled in every build). Written against c10's
// device-generic stream and event API (`VirtualGuardImpl`, `c10::Event`), which lives in
// libc10 — so CPU builds link it unchanged, and at run time the CUDA backend
// (libtorch_cuda.so, which registers itself when loaded) supplies the implementation. tch
// 0.26 exposes no streams or events, hence this shim.
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <mutex>
#include <optional>
#include <vector>

namespace {
struct CopyScope {
    c10::Stream previous;
    c10::Stream side;
};

// One side stream per device for the whole process, taken from CUDA's pool once: the caching
// allocator reuses a freed block only on the stream it was allocated on, so a new pool
// stream per batch (the pool hands out its 32 streams in turn) would keep ~32 batches of
// device memory cached before any of it came back.
c10::Stream side_stream(const c10::impl::VirtualGuardImpl &impl, c10::Device device) {
    static std::mutex mutex;
    static std::vector<std::optional<c10::Stream>> streams;
    std::lock_guard<std::mutex> lock(mutex);
    auto index = static_cast<size_t>(device.index());
    if (streams.size() <= index) {
        streams.resize(index + 1);
    }
    if (!streams[index]) {
        streams[index] = impl.getStreamFromGlobalPool(device, false);
    }
    return *streams[index];
}
} // namespace

// Makes the device's side stream (from CUDA's pool, created non-blocking: it does not
// synchronise with the legacy default stream) the calling thread's current stream on device
// `index`, so the copies that follow overlap with work queued on other streams. Null when
// CUDA is absent. (Every entry point catches: no C++ exception may cross into Rust.)
extern "C" void *sluice_cuda_copy_begin(int index) noexcept {
    try {
        if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
            return nullptr;
        }
        c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
        c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
        c10::Stream side = side_stream(impl, device);
        c10::Stream previous = impl.exchangeStream(side);
        return new CopyScope{previous, side};
    } catch (...) {
        return nullptr;
    }
}

// Ends a scope: records an event on the side stream after every copy queued in it, puts the
// thread's previous stream back, and returns the event (heap; see `sluice_cuda_ready`).
extern "C" void *sluice_cuda_copy_end(void *scope_ptr) noexcept {
    auto *scope = static_cast<CopyScope *>(scope_ptr);
    c10::Event *event = nullptr;
    try {
        event = new c10::Event(c10::DeviceType::CUDA);
        event->record(scope->side);
    } catch (...) {
        delete event;
        event = nullptr;
    }
    try {
        c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).exchangeStream(scope->previous);
    } catch (...) {
        // Only reachable after a successful begin, where it cannot fail.
    }
    delete scope;
    return event;
}

// On the consumer's thread: its current stream waits (on the device, the host does not) for
// the event, and each tensor's memory is marked as used on that stream so the caching
// allocator does not hand it out again before the consumer's work on it is done. Frees the
// event. 0 on success.
extern "C" int sluice_cuda_ready(void *event_ptr, at::Tensor **tensors, size_t n) noexcept {
    auto *event = static_cast<c10::Event *>(event_ptr);
    int rc = 0;
    try {
        c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
        c10::Stream current = impl.getStream(event->device());
        event->block(current);
        for (size_t i = 0; i < n; ++i) {
            const at::Tensor &t = *tensors[i];
            if (t.defined() && t.is_cuda() && t.has_storage()) {
                impl.recordDataPtrOnStream(t.storage().data_ptr(), current);
            }
        }
    } catch (...) {
        rc = -1;
    }
    delete event;
    return rc;
}

// Frees an event whose batch was never handed over.
extern "C" void sluice_cuda_event_free(void *event_ptr) noexcept {
    delete static_cast<c10::Event *>(event_ptr);
}
