// rdx::cuda: owning device and pinned host buffers, streams and events.
#pragma once

#include <rdx/cuda/check.hpp>

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

namespace rdx::cuda {

//! Makes a device current for a scope and restores the previous one.
class device_guard {
public:
  //! Makes device current, if it is not already, until the guard is destroyed.
  //! @throws rdx::cuda::cuda_error when cudaGetDevice or cudaSetDevice fails
  explicit device_guard(int device) {
    RDX_CUDA_TRY(cudaGetDevice(&previous_));
    if (device != previous_) {
      RDX_CUDA_TRY(cudaSetDevice(device));
    }
  }
  ~device_guard() { detail::check_noexcept(cudaSetDevice(previous_), "cudaSetDevice (restore)"); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  device_guard(device_guard&&) = delete;
  device_guard& operator=(device_guard&&) = delete;

private:
  int previous_ = 0;
};

//! The current device of the calling thread.
[[nodiscard]] inline int current_device() {
  int d = 0;
  RDX_CUDA_TRY(cudaGetDevice(&d));
  return d;
}

namespace detail {
//! The move-only ownership all CUDA owners share: one handle, freed once by
//! Free (a cudaFree-like call named in the log if it fails), never thrown.
template <class H, cudaError_t (*Free)(H), const char* Name>
class cuda_owner {
public:
  cuda_owner() noexcept = default;
  explicit cuda_owner(H h) noexcept : h_(h) {}
  cuda_owner(cuda_owner&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  cuda_owner& operator=(cuda_owner&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  cuda_owner(const cuda_owner&) = delete;
  cuda_owner& operator=(const cuda_owner&) = delete;
  ~cuda_owner() { reset(); }

  [[nodiscard]] H get() const noexcept { return h_; }
  [[nodiscard]] H* out() noexcept { return &h_; }
  [[nodiscard]] H release() noexcept { return std::exchange(h_, nullptr); }

private:
  void reset() noexcept {
    if (h_ != nullptr) {
      check_noexcept(Free(h_), Name);
    }
    h_ = nullptr;
  }
  H h_ = nullptr;
};

//! cudaStreamQuery/cudaEventQuery: true when done, false when still running
//! (clearing the not-ready status), a cuda_error for anything else.
[[nodiscard]] inline bool query_ready(cudaError_t st, const char* call) {
  if (st == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  check(st, call);
  return true;
}

inline constexpr char cuda_free_name[] = "cudaFree";
inline constexpr char cuda_free_host_name[] = "cudaFreeHost";
inline constexpr char stream_destroy_name[] = "cudaStreamDestroy";
inline constexpr char event_destroy_name[] = "cudaEventDestroy";
inline cudaError_t free_device(void* p) {
  return cudaFree(p);
}
inline cudaError_t free_host(void* p) {
  return cudaFreeHost(p);
}
inline cudaError_t destroy_stream(cudaStream_t s) {
  return cudaStreamDestroy(s);
}
inline cudaError_t destroy_event(cudaEvent_t e) {
  return cudaEventDestroy(e);
}

//! count elements of T in memory from one CUDA allocator; what device_buffer
//! and pinned_buffer share.
template <class T, cudaError_t (*Free)(void*), const char* FreeName>
class cuda_array {
  static_assert(std::is_trivially_copyable_v<T>,
                "rdx::cuda buffers hold bytes copied by DMA: T must be trivially copyable");

public:
  using value_type = T;

  cuda_array(const cuda_array&) = delete;
  cuda_array& operator=(const cuda_array&) = delete;

  [[nodiscard]] T* data() const noexcept { return static_cast<T*>(mem_.get()); }
  [[nodiscard]] T* native_handle() const noexcept { return data(); }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  //! Gives up ownership; the caller frees the pointer (FreeName).
  [[nodiscard]] T* release() noexcept {
    count_ = 0;
    return static_cast<T*>(mem_.release());
  }

protected:
  cuda_array() noexcept = default;
  cuda_array(void* p, std::size_t count) noexcept : mem_(p), count_(p != nullptr ? count : 0) {}
  cuda_array(cuda_array&& o) noexcept : mem_(std::move(o.mem_)), count_(std::exchange(o.count_, 0)) {}
  cuda_array& operator=(cuda_array&& o) noexcept {
    mem_ = std::move(o.mem_);
    count_ = std::exchange(o.count_, 0);
    return *this;
  }
  ~cuda_array() = default;

private:
  cuda_owner<void*, Free, FreeName> mem_;
  std::size_t count_ = 0;
};
}  // namespace detail

//! count elements of T in device memory (cudaMalloc), freed on destruction.
//! From an internal base it also has data(), size(), size_bytes(), empty(),
//! native_handle() (the pointer) and release().
template <class T>
class device_buffer : public detail::cuda_array<T, &detail::free_device, detail::cuda_free_name> {
  using base = detail::cuda_array<T, &detail::free_device, detail::cuda_free_name>;

public:
  device_buffer() noexcept = default;
  //! Allocates count elements on the current device.
  //! @throws rdx::cuda::cuda_error when cudaMalloc fails (no GPU, out of memory)
  explicit device_buffer(std::size_t count) : base(allocate(count), count) {
    if (count != 0) {
      RDX_CUDA_TRY(cudaGetDevice(&device_));
    }
  }
  //! Takes ownership of memory from cudaMalloc; refuses nullptr.
  [[nodiscard]] static device_buffer from_native_handle(T* p, std::size_t count, int device) {
    if (p == nullptr) {
      rdx::detail::throw_rdx(errc::invalid_argument, "device_buffer::from_native_handle: nullptr");
    }
    return device_buffer(p, count, device);
  }
  //! Takes o's memory; o is left empty.
  device_buffer(device_buffer&& o) noexcept = default;
  //! Frees this buffer's memory, then takes o's; o is left empty.
  device_buffer& operator=(device_buffer&& o) noexcept = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() = default;

  // data() is a device pointer: never dereference it on the host.
  //! The device the memory lives on.
  [[nodiscard]] int device() const noexcept { return device_; }

private:
  device_buffer(T* p, std::size_t count, int device) noexcept : base(p, count), device_(device) {}
  static void* allocate(std::size_t count) {
    void* p = nullptr;
    if (count != 0) {
      RDX_CUDA_TRY(cudaMalloc(&p, count * sizeof(T)));
    }
    return p;
  }
  int device_ = 0;
};

//! count elements of T in page-locked host memory (cudaMallocHost), which the
//! GPU copies at full speed and an RDMA device can register. From an internal
//! base it also has data(), size(), size_bytes(), empty(), native_handle() and
//! release().
template <class T>
class pinned_buffer : public detail::cuda_array<T, &detail::free_host, detail::cuda_free_host_name> {
  using base = detail::cuda_array<T, &detail::free_host, detail::cuda_free_host_name>;

public:
  pinned_buffer() noexcept = default;
  //! @throws rdx::cuda::cuda_error when cudaMallocHost fails
  explicit pinned_buffer(std::size_t count) : base(allocate(count), count) {}
  //! Takes ownership of memory from cudaMallocHost; refuses nullptr.
  [[nodiscard]] static pinned_buffer from_native_handle(T* p, std::size_t count) {
    if (p == nullptr) {
      rdx::detail::throw_rdx(errc::invalid_argument, "pinned_buffer::from_native_handle: nullptr");
    }
    return pinned_buffer(p, count);
  }
  //! Takes o's memory; o is left empty.
  pinned_buffer(pinned_buffer&& o) noexcept = default;
  //! Frees this buffer's memory, then takes o's; o is left empty.
  pinned_buffer& operator=(pinned_buffer&& o) noexcept = default;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() = default;

  //! Element i, read or written on the host; not bounds-checked.
  [[nodiscard]] T& operator[](std::size_t i) const noexcept { return this->data()[i]; }
  //! The first element (host pointer).
  [[nodiscard]] T* begin() const noexcept { return this->data(); }
  //! One past the last element.
  [[nodiscard]] T* end() const noexcept { return this->data() + this->size(); }
  //! All elements as a host span.
  [[nodiscard]] std::span<T> span() const noexcept { return {this->data(), this->size()}; }

private:
  pinned_buffer(T* p, std::size_t count) noexcept : base(p, count) {}
  static void* allocate(std::size_t count) {
    void* p = nullptr;
    if (count != 0) {
      RDX_CUDA_TRY(cudaMallocHost(&p, count * sizeof(T)));
    }
    return p;
  }
};

//! An owned CUDA stream; non-blocking by default, so it never serializes
//! with the legacy default stream.
class stream {
public:
  //! @throws rdx::cuda::cuda_error when cudaStreamCreateWithFlags fails
  explicit stream(unsigned flags = cudaStreamNonBlocking) {
    RDX_CUDA_TRY(cudaStreamCreateWithFlags(s_.out(), flags));
  }
  //! Takes ownership of a stream from cudaStreamCreate*.
  //! @throws rdx::error (errc::invalid_argument) for nullptr: the legacy default stream is not owned
  [[nodiscard]] static stream from_native_handle(cudaStream_t s) {
    if (s == nullptr) {
      rdx::detail::throw_rdx(errc::invalid_argument, "stream::from_native_handle: nullptr");
    }
    return stream(s, adopt_tag{});
  }

  //! The cudaStream_t, still owned by this object.
  [[nodiscard]] cudaStream_t native_handle() const noexcept { return s_.get(); }
  //! Gives up ownership; the caller destroys the stream (cudaStreamDestroy).
  [[nodiscard]] cudaStream_t release() noexcept { return s_.release(); }
  //! Blocks until all work queued so far has finished.
  void synchronize() const { RDX_CUDA_TRY(cudaStreamSynchronize(s_.get())); }
  //! True when all queued work has finished.
  [[nodiscard]] bool ready() const {
    return detail::query_ready(cudaStreamQuery(s_.get()), "cudaStreamQuery");
  }

private:
  struct adopt_tag {};
  stream(cudaStream_t s, adopt_tag) noexcept : s_(s) {}
  detail::cuda_owner<cudaStream_t, &detail::destroy_stream, detail::stream_destroy_name> s_;
};

//! An owned CUDA event. Without timing by default: such events are cheaper
//! to record and to wait for.
class event {
public:
  //! Whether an event records a timestamp, which elapsed_ms() needs.
  enum class timing : bool { off = false, on = true };

  //! @throws rdx::cuda::cuda_error when cudaEventCreateWithFlags fails
  explicit event(timing t = timing::off) {
    RDX_CUDA_TRY(
        cudaEventCreateWithFlags(e_.out(), t == timing::on ? cudaEventDefault : cudaEventDisableTiming));
  }
  //! Takes ownership of an event from cudaEventCreate*.
  //! @throws rdx::error (errc::invalid_argument) for nullptr
  [[nodiscard]] static event from_native_handle(cudaEvent_t e) {
    if (e == nullptr) {
      rdx::detail::throw_rdx(errc::invalid_argument, "event::from_native_handle: nullptr");
    }
    return event(e, adopt_tag{});
  }

  //! The cudaEvent_t, still owned by this object.
  [[nodiscard]] cudaEvent_t native_handle() const noexcept { return e_.get(); }
  //! Gives up ownership; the caller destroys the event (cudaEventDestroy).
  [[nodiscard]] cudaEvent_t release() noexcept { return e_.release(); }
  //! Records the event on s: it completes once the work queued on s so far has.
  void record(const stream& s) { RDX_CUDA_TRY(cudaEventRecord(e_.get(), s.native_handle())); }
  //! Records the event on a stream this object does not own (nullptr: the legacy default stream).
  void record(cudaStream_t s) { RDX_CUDA_TRY(cudaEventRecord(e_.get(), s)); }
  //! Blocks until the work before the last record() has finished.
  void synchronize() const { RDX_CUDA_TRY(cudaEventSynchronize(e_.get())); }
  //! True when the work before the last record() has finished, or when the event was never recorded.
  [[nodiscard]] bool ready() const { return detail::query_ready(cudaEventQuery(e_.get()), "cudaEventQuery"); }
  //! Milliseconds between two recorded timing events.
  [[nodiscard]] static float elapsed_ms(const event& start, const event& stop) {
    float ms = 0;
    RDX_CUDA_TRY(cudaEventElapsedTime(&ms, start.e_.get(), stop.e_.get()));
    return ms;
  }

private:
  struct adopt_tag {};
  event(cudaEvent_t e, adopt_tag) noexcept : e_(e) {}
  detail::cuda_owner<cudaEvent_t, &detail::destroy_event, detail::event_destroy_name> e_;
};

}  // namespace rdx::cuda
