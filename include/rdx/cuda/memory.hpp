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

//! count elements of T in device memory (cudaMalloc), freed on destruction.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "device_buffer holds bytes copied by DMA: T must be trivially copyable");

public:
  using value_type = T;

  device_buffer() noexcept = default;
  //! Allocates count elements on the current device.
  //! @throws rdx::cuda::cuda_error when cudaMalloc fails (no GPU, out of memory)
  explicit device_buffer(std::size_t count) : count_(count) {
    if (count == 0) {
      return;
    }
    void* p = nullptr;
    RDX_CUDA_TRY(cudaMalloc(&p, count * sizeof(T)));
    data_ = static_cast<T*>(p);
    RDX_CUDA_TRY(cudaGetDevice(&device_));
  }
  //! Takes ownership of memory from cudaMalloc; refuses nullptr.
  [[nodiscard]] static device_buffer from_native_handle(T* p, std::size_t count, int device) {
    if (p == nullptr) {
      rdx::detail::throw_rdx(errc::invalid_argument, "device_buffer::from_native_handle: nullptr");
    }
    device_buffer b;
    b.data_ = p;
    b.count_ = count;
    b.device_ = device;
    return b;
  }
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)), device_(o.device_) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  //! Device pointer; never dereference it on the host.
  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] T* native_handle() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  //! The device the memory lives on.
  [[nodiscard]] int device() const noexcept { return device_; }
  //! Gives up ownership; the caller frees the pointer with cudaFree.
  [[nodiscard]] T* release() noexcept {
    count_ = 0;
    return std::exchange(data_, nullptr);
  }

private:
  void reset() noexcept {
    if (data_ != nullptr) {
      detail::check_noexcept(cudaFree(data_), "cudaFree");
    }
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
  int device_ = 0;
};

//! count elements of T in page-locked host memory (cudaMallocHost), which the
//! GPU copies at full speed and an RDMA device can register.
template <class T>
class pinned_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "pinned_buffer holds bytes copied by DMA: T must be trivially copyable");

public:
  using value_type = T;

  pinned_buffer() noexcept = default;
  //! @throws rdx::cuda::cuda_error when cudaMallocHost fails
  explicit pinned_buffer(std::size_t count) : count_(count) {
    if (count == 0) {
      return;
    }
    void* p = nullptr;
    RDX_CUDA_TRY(cudaMallocHost(&p, count * sizeof(T)));
    data_ = static_cast<T*>(p);
  }
  //! Takes ownership of memory from cudaMallocHost; refuses nullptr.
  [[nodiscard]] static pinned_buffer from_native_handle(T* p, std::size_t count) {
    if (p == nullptr) {
      rdx::detail::throw_rdx(errc::invalid_argument, "pinned_buffer::from_native_handle: nullptr");
    }
    pinned_buffer b;
    b.data_ = p;
    b.count_ = count;
    return b;
  }
  pinned_buffer(pinned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { reset(); }

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] T* native_handle() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  [[nodiscard]] T& operator[](std::size_t i) const noexcept { return data_[i]; }
  [[nodiscard]] T* begin() const noexcept { return data_; }
  [[nodiscard]] T* end() const noexcept { return data_ + count_; }
  [[nodiscard]] std::span<T> span() const noexcept { return {data_, count_}; }
  //! Gives up ownership; the caller frees the pointer with cudaFreeHost.
  [[nodiscard]] T* release() noexcept {
    count_ = 0;
    return std::exchange(data_, nullptr);
  }

private:
  void reset() noexcept {
    if (data_ != nullptr) {
      detail::check_noexcept(cudaFreeHost(data_), "cudaFreeHost");
    }
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

//! An owned CUDA stream; non-blocking by default, so it never serializes
//! with the legacy default stream.
class stream {
public:
  //! @throws rdx::cuda::cuda_error when cudaStreamCreateWithFlags fails
  explicit stream(unsigned flags = cudaStreamNonBlocking) {
    RDX_CUDA_TRY(cudaStreamCreateWithFlags(&s_, flags));
  }
  [[nodiscard]] static stream from_native_handle(cudaStream_t s) {
    if (s == nullptr) {
      rdx::detail::throw_rdx(errc::invalid_argument, "stream::from_native_handle: nullptr");
    }
    return stream(s, adopt_tag{});
  }
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { reset(); }

  [[nodiscard]] cudaStream_t native_handle() const noexcept { return s_; }
  [[nodiscard]] cudaStream_t release() noexcept { return std::exchange(s_, nullptr); }
  //! Blocks until all work queued so far has finished.
  void synchronize() const { RDX_CUDA_TRY(cudaStreamSynchronize(s_)); }
  //! True when all queued work has finished.
  [[nodiscard]] bool ready() const {
    const cudaError_t st = cudaStreamQuery(s_);
    if (st == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    RDX_CUDA_TRY(st);
    return true;
  }

private:
  struct adopt_tag {};
  stream(cudaStream_t s, adopt_tag) noexcept : s_(s) {}
  void reset() noexcept {
    if (s_ != nullptr) {
      detail::check_noexcept(cudaStreamDestroy(s_), "cudaStreamDestroy");
    }
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

//! An owned CUDA event. Without timing by default: such events are cheaper
//! to record and to wait for.
class event {
public:
  enum class timing : bool { off = false, on = true };

  //! @throws rdx::cuda::cuda_error when cudaEventCreateWithFlags fails
  explicit event(timing t = timing::off) {
    RDX_CUDA_TRY(cudaEventCreateWithFlags(&e_, t == timing::on ? cudaEventDefault : cudaEventDisableTiming));
  }
  [[nodiscard]] static event from_native_handle(cudaEvent_t e) {
    if (e == nullptr) {
      rdx::detail::throw_rdx(errc::invalid_argument, "event::from_native_handle: nullptr");
    }
    return event(e, adopt_tag{});
  }
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { reset(); }

  [[nodiscard]] cudaEvent_t native_handle() const noexcept { return e_; }
  [[nodiscard]] cudaEvent_t release() noexcept { return std::exchange(e_, nullptr); }
  void record(const stream& s) { RDX_CUDA_TRY(cudaEventRecord(e_, s.native_handle())); }
  void record(cudaStream_t s) { RDX_CUDA_TRY(cudaEventRecord(e_, s)); }
  void synchronize() const { RDX_CUDA_TRY(cudaEventSynchronize(e_)); }
  [[nodiscard]] bool ready() const {
    const cudaError_t st = cudaEventQuery(e_);
    if (st == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    RDX_CUDA_TRY(st);
    return true;
  }
  //! Milliseconds between two recorded timing events.
  [[nodiscard]] static float elapsed_ms(const event& start, const event& stop) {
    float ms = 0;
    RDX_CUDA_TRY(cudaEventElapsedTime(&ms, start.e_, stop.e_));
    return ms;
  }

private:
  struct adopt_tag {};
  event(cudaEvent_t e, adopt_tag) noexcept : e_(e) {}
  void reset() noexcept {
    if (e_ != nullptr) {
      detail::check_noexcept(cudaEventDestroy(e_), "cudaEventDestroy");
    }
    e_ = nullptr;
  }
  cudaEvent_t e_ = nullptr;
};

}  // namespace rdx::cuda
