// The emulated HPU device of the test double (tests/hpu_double).
//
// It makes "hpu" a device stock torch can hold tensors on, as Habana's bridge
// does on a Gaudi, with the data in host memory:
// - a device guard, accelerator hooks (torch.accelerator reports "hpu", pinned
//   host memory) and a plain (not caching) device allocator, so
//   torch.accelerator's memory calls fail as they do on Habana's torch;
// - kernels for the HPU dispatch key: factories and views on HPU storage, and
//   for every other operator a fallback that runs the CPU kernel on host views
//   of the HPU storage and hands the results back as HPU tensors;
// - the device's memory limit, in-use and peak counters, the card acquisition
//   (a callback into Python on the first use), and the graph-compilation
//   counter of eager and lazy mode.
// Python drives it through the C functions at the end (ctypes) and the
// hpu_double:: operators.

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/HPUHooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>

using c10::DeviceType;

namespace hpu_double {

// ---------------------------------------------------------------- state ----

std::atomic<int> g_device_count{0};
thread_local c10::DeviceIndex t_current_device = 0;

using AcquireCallback = int (*)(const char*);
std::atomic<AcquireCallback> g_acquire_callback{nullptr};
std::atomic<bool> g_acquired{false};
std::mutex& g_acquire_mutex = *new std::mutex();

// The first use of the device acquires a card (Python decides which, records
// who, and fails as the bridge does when none is free).
void acquire(const char* why) {
  if (g_acquired.load()) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_acquire_mutex);
  if (g_acquired.load()) {
    return;
  }
  auto callback = g_acquire_callback.load();
  TORCH_CHECK(callback != nullptr, "HPU double: the bridge was not initialized");
  TORCH_CHECK(callback(why) == 0, "Device acquire failed.");
  g_acquired.store(true);
}

struct MemoryStats {
  std::mutex mutex;
  int64_t limit = 0;
  int64_t in_use = 0;
  int64_t max_in_use = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t active_allocs = 0;
  int64_t max_alloc_size = 0;
};
// Never destroyed: tensors freed while the process exits still count here.
MemoryStats& g_memory = *new MemoryStats();

void count_allocation(int64_t nbytes) {
  std::lock_guard<std::mutex> lock(g_memory.mutex);
  TORCH_CHECK_WITH(
      OutOfMemoryError,
      g_memory.in_use + nbytes <= g_memory.limit,
      "Allocation failed for size::",
      nbytes,
      " (",
      g_memory.in_use,
      " of ",
      g_memory.limit,
      " bytes of the HPU in use)");
  g_memory.in_use += nbytes;
  g_memory.max_in_use = std::max(g_memory.max_in_use, g_memory.in_use);
  g_memory.num_allocs += 1;
  g_memory.active_allocs += 1;
  g_memory.max_alloc_size = std::max(g_memory.max_alloc_size, nbytes);
}

void count_free(int64_t nbytes) {
  std::lock_guard<std::mutex> lock(g_memory.mutex);
  g_memory.in_use -= nbytes;
  g_memory.num_frees += 1;
  g_memory.active_allocs -= 1;
}

// Graph compilations: in eager mode every new (operator, shapes) pair is a
// recipe compiled once; in lazy mode the operators since the last step form one
// graph, compiled the first time that sequence is seen.
struct GraphCounter {
  std::mutex mutex;
  bool lazy = false;
  bool lazy_collectives = false;
  int paused = 0;
  bool capturing = false;
  uint64_t pending_hash = 0;
  int64_t pending_ops = 0;
  int64_t compilations = 0;
  int64_t steps = 0;
  std::unordered_set<uint64_t> seen;
};
GraphCounter& g_graphs = *new GraphCounter();

uint64_t mix(uint64_t seed, uint64_t value) {
  return seed ^ (value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

uint64_t hash_tensor(uint64_t seed, const at::Tensor& t) {
  if (!t.defined()) {
    return mix(seed, 1);
  }
  seed = mix(seed, static_cast<uint64_t>(t.scalar_type()));
  for (auto size : t.sizes()) {
    seed = mix(seed, static_cast<uint64_t>(size));
  }
  return seed;
}

uint64_t hash_inputs(const c10::OperatorHandle& op, const torch::jit::Stack& args) {
  uint64_t h = std::hash<std::string>{}(c10::toString(op.operator_name()));
  for (const auto& iv : args) {
    if (iv.isTensor()) {
      h = hash_tensor(h, iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList().vec()) {
        h = hash_tensor(h, t);
      }
    }
  }
  return h;
}

void step_locked() {
  if (g_graphs.pending_ops > 0) {
    if (g_graphs.seen.insert(g_graphs.pending_hash).second) {
      g_graphs.compilations += 1;
    }
    g_graphs.steps += 1;
  }
  g_graphs.pending_ops = 0;
  g_graphs.pending_hash = 0;
}

void note_operator(uint64_t h) {
  std::lock_guard<std::mutex> lock(g_graphs.mutex);
  if (g_graphs.paused > 0) {
    return;
  }
  if (g_graphs.lazy) {
    g_graphs.pending_hash = mix(g_graphs.pending_hash, h);
    g_graphs.pending_ops += 1;
  } else if (g_graphs.seen.insert(h).second) {
    g_graphs.compilations += 1;
  }
}

// A host read of device data runs the pending lazy graph first.
void host_read() {
  std::lock_guard<std::mutex> lock(g_graphs.mutex);
  if (g_graphs.lazy && g_graphs.paused == 0) {
    step_locked();
  }
}

// ---------------------------------------------------------------- fp8 ----

// Gaudi2's e4m3 keeps the top exponent for Inf/NaN: its largest value is 240
// and the bytes of larger e4m3fn values (256 to 448) read as non-finite. Gaudi3
// uses OCP e4m3fn (448). 0 means OCP.
std::atomic<double> g_fp8_e4m3_max{0.0};

bool gaudi2_fp8(const at::Tensor& t) {
  return g_fp8_e4m3_max.load() > 0.0 && t.defined() &&
      t.scalar_type() == at::kFloat8_e4m3fn;
}

// The values of e4m3fn bytes as Gaudi2 computes with them: the top exponent
// (bits 0x78 set) reads as NaN.
at::Tensor gaudi2_values(const at::Tensor& host) {
  auto bytes = host.contiguous().view(at::kByte);
  auto top_exponent = bytes.bitwise_and(0x78).eq(0x78);
  auto nan = at::full_like(bytes, 0x7F);
  return at::where(top_exponent, nan, bytes).view(at::kFloat8_e4m3fn);
}

// Operators that move e4m3 bytes without computing with them.
bool moves_bytes(const c10::OperatorHandle& op) {
  static const std::unordered_set<std::string> names = {
      "aten::cat", "aten::stack", "aten::index_select", "aten::index",
      "aten::_unsafe_index", "aten::gather", "aten::scatter", "aten::index_put_",
      "aten::_index_put_impl_", "aten::index_copy_", "aten::index_copy",
      "aten::clone", "aten::copy_", "aten::repeat", "aten::flip", "aten::roll",
      "aten::constant_pad_nd", "aten::masked_fill_", "aten::fill_", "aten::zero_",
      "aten::index_fill_", "aten::masked_scatter_", "aten::split_with_sizes_copy",
      "aten::_to_copy", "aten::view_copy", "aten::as_strided_copy"};
  return names.count(op.operator_name().name) > 0;
}

// --------------------------------------------------- device guard, hooks ----

struct HpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override {
    return DeviceType::HPU;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(DeviceType::HPU, t_current_device);
  }
  void setDevice(c10::Device d) const override {
    t_current_device = d.index() < 0 ? 0 : d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    t_current_device = d.index() < 0 ? 0 : d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  void synchronizeDevice(c10::DeviceIndex) const override {}
};
C10_REGISTER_GUARD_IMPL(HPU, HpuGuardImpl);

// Pinned host memory: host memory whose pointers are remembered, so
// Tensor.is_pinned() answers as on a device with a pinned-memory allocator.
std::mutex& g_pinned_mutex = *new std::mutex();
std::unordered_set<const void*>& g_pinned = *new std::unordered_set<const void*>();

void free_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(ptr);
  }
  c10::free_cpu(ptr);
}

struct PinnedAllocator final : at::HostAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = c10::alloc_cpu(nbytes);
    {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned.insert(ptr);
    }
    return {ptr, ptr, &free_pinned, c10::Device(DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  // Host memory is freed when released: there is nothing cached to empty, and
  // no stream to wait for.
  bool record_event(void*, void*, c10::Stream) override {
    return true;
  }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    return {};
  }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};
PinnedAllocator& g_pinned_allocator = *new PinnedAllocator();
REGISTER_HOST_ALLOCATOR(at::kHPU, &g_pinned_allocator);

// The device memory: host memory counted against the card's limit. Not a
// c10::DeviceAllocator, as on Habana's torch, so torch.accelerator's memory
// calls (empty_cache, memory_stats, ...) fail as they do there.
struct Allocation {
  void* ptr;
  int64_t nbytes;
};

void free_device(void* ctx) {
  auto* allocation = static_cast<Allocation*>(ctx);
  count_free(allocation->nbytes);
  c10::free_cpu(allocation->ptr);
  delete allocation;
}

struct HpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    acquire("tensor allocation");
    count_allocation(static_cast<int64_t>(nbytes));
    void* ptr = c10::alloc_cpu(nbytes);
    auto* allocation = new Allocation{ptr, static_cast<int64_t>(nbytes)};
    return {ptr, allocation, &free_device, c10::Device(DeviceType::HPU, t_current_device)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
HpuAllocator& g_allocator = *new HpuAllocator();
REGISTER_ALLOCATOR(DeviceType::HPU, &g_allocator);

struct HpuHooks final : at::HPUHooksInterface {
  explicit HpuHooks(at::HPUHooksArgs) {}
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return g_device_count.load() > 0;
  }
  void init() const override {}
  bool hasHPU() const override {
    return g_device_count.load() > 0;
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    t_current_device = device;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return t_current_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = t_current_device;
    t_current_device = device;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    return g_pinned.count(data) > 0;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return g_acquired.load();
  }
  c10::Device getDeviceFromPtr(void*) const override {
    return c10::Device(DeviceType::HPU, t_current_device);
  }
};

// -------------------------------------------- host views and adoption ----

c10::DispatchKeySet hpu_keys() {
  return c10::DispatchKeySet(c10::DispatchKey::HPU);
}

// A CPU tensor over the HPU tensor's memory (no copy); it keeps the HPU
// storage alive while it lives.
at::Tensor host_view(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  auto* owner = new c10::Storage(storage);
  c10::DataPtr data(
      const_cast<void*>(storage.data()),
      owner,
      [](void* ctx) { delete static_cast<c10::Storage*>(ctx); },
      c10::Device(DeviceType::CPU));
  // Resizable, so a CPU kernel can grow an out= argument; the fallback then
  // moves the HPU tensor onto the grown memory.
  c10::Storage host(
      c10::Storage::use_byte_size_t(),
      storage.nbytes(),
      std::move(data),
      c10::GetCPUAllocator(),
      true);
  auto view = at::detail::make_tensor<c10::TensorImpl>(
      std::move(host), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return view;
}

// An HPU tensor over an HPU storage, with the given geometry.
at::Tensor on_storage(const c10::Storage& storage, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), hpu_keys(), like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return t;
}

struct Adopted {
  c10::Storage host;
  int64_t nbytes;
};

// An HPU tensor taking over a CPU result's memory (no copy), counted as
// device memory from now on.
c10::Storage adopt_storage(const c10::Storage& host) {
  const auto nbytes = static_cast<int64_t>(host.nbytes());
  acquire("tensor allocation");
  count_allocation(nbytes);
  auto* owner = new Adopted{host, nbytes};
  c10::DataPtr data(
      const_cast<void*>(host.data()),
      owner,
      [](void* ctx) {
        auto* adopted = static_cast<Adopted*>(ctx);
        count_free(adopted->nbytes);
        delete adopted;
      },
      c10::Device(DeviceType::HPU, t_current_device));
  return c10::Storage(
      c10::Storage::use_byte_size_t(), host.nbytes(), std::move(data), &g_allocator, true);
}

at::Tensor adopt(const at::Tensor& cpu) {
  return on_storage(adopt_storage(cpu.storage()), cpu);
}

bool is_hpu(const at::Tensor& t) {
  return t.defined() && t.device().type() == DeviceType::HPU;
}

// ------------------------------------------------------------ kernels ----

at::Tensor empty_memory_format(
    c10::IntArrayRef size,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout>,
    std::optional<at::Device>,
    std::optional<bool>,
    std::optional<at::MemoryFormat> memory_format) {
  return at::detail::empty_generic(
      size, &g_allocator, hpu_keys(), at::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size,
    c10::IntArrayRef stride,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout>,
    std::optional<at::Device>,
    std::optional<bool>) {
  return at::detail::empty_strided_generic(
      size, stride, &g_allocator, hpu_keys(), at::dtype_or_default(dtype));
}

const at::Tensor& resize_(
    const at::Tensor& self,
    c10::IntArrayRef size,
    std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  const auto needed = (impl->numel() + impl->storage_offset()) * self.itemsize();
  if (needed > static_cast<int64_t>(self.storage().nbytes())) {
    at::native::resize_bytes_nocuda(self.storage(), needed);
  }
  if (memory_format.has_value()) {
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage(
    at::Tensor& self,
    c10::Storage source,
    int64_t storage_offset,
    c10::IntArrayRef size,
    c10::IntArrayRef stride) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(storage_offset);
  } else {
    impl->set_sizes_and_strides(size, stride, storage_offset);
  }
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const auto numel = static_cast<int64_t>(source.nbytes()) / self.itemsize();
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return set_storage(
      self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

// Copies between devices: the bridge's DMA, here a host copy. Reading device
// data on the host runs the pending lazy graph first.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (is_hpu(self) && !is_hpu(dst)) {
    host_read();
  }
  auto src_host = is_hpu(self) ? host_view(self) : self;
  auto dst_host = is_hpu(dst) ? host_view(dst) : dst;
  const bool fp8_to_other = is_hpu(self) && gaudi2_fp8(self) && !gaudi2_fp8(dst);
  const bool other_to_fp8 = is_hpu(dst) && gaudi2_fp8(dst) && !gaudi2_fp8(self);
  if (fp8_to_other) {
    src_host = gaudi2_values(src_host);
  } else if (other_to_fp8) {
    // The device's conversion saturates at its largest finite value.
    const double max = g_fp8_e4m3_max.load();
    src_host = src_host.clamp(-max, max);
  }
  dst_host.copy_(src_host, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    if (is_hpu(dst)) {
      resize_(dst, self.sizes(), std::nullopt);
    } else {
      dst.resize_(self.sizes());
    }
  }
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  host_read();
  return host_view(self).item();
}

// ----------------------------------------------------------- fallback ----

struct Converted {
  std::vector<std::pair<at::Tensor, at::Tensor>> hpu_of_view;  // (host view, HPU tensor)
  std::vector<c10::Storage> storages;
  bool saw_hpu = false;
  bool saw_host_array = false;
};

at::Tensor to_host(const at::Tensor& t, Converted& seen, bool computes) {
  if (!t.defined()) {
    return t;
  }
  if (!is_hpu(t)) {
    seen.saw_host_array = seen.saw_host_array || t.dim() > 0;
    return t;
  }
  seen.saw_hpu = true;
  auto view = host_view(t);
  seen.hpu_of_view.emplace_back(view, t);
  seen.storages.push_back(t.storage());
  return computes && gaudi2_fp8(t) ? gaudi2_values(view) : view;
}

bool is_list_of_lists(const c10::IValue& iv) {
  return iv.isList() && iv.toList().elementType()->kind() == c10::TypeKind::ListType;
}

c10::IValue arg_to_host(const c10::IValue& iv, Converted& seen, bool computes) {
  if (iv.isTensor()) {
    return to_host(iv.toTensor(), seen, computes);
  }
  if (iv.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : iv.toTensorList().vec()) {
      list.push_back(to_host(t, seen, computes));
    }
    return list;
  }
  if (iv.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> list;
    for (const auto& t : iv.toOptionalTensorList().vec()) {
      list.push_back(t.has_value() ? std::optional<at::Tensor>(to_host(*t, seen, computes)) : std::nullopt);
    }
    return list;
  }
  if (is_list_of_lists(iv)) {  // Tensor[][] (collectives)
    c10::impl::GenericList list(iv.toList().elementType());
    for (const c10::IValue& item : iv.toList().vec()) {
      list.push_back(arg_to_host(item, seen, computes));
    }
    return list;
  }
  if (iv.isDevice() && iv.toDevice().type() == DeviceType::HPU) {
    return c10::Device(DeviceType::CPU);
  }
  return iv;
}

// An out= argument the CPU kernel resized: the HPU tensor takes the new
// geometry, and the new memory if the kernel had to allocate it.
void follow_resize(const at::Tensor& view, const at::Tensor& original) {
  auto* impl = original.unsafeGetTensorImpl();
  if (view.storage().data() != original.storage().data()) {
    impl->set_storage_keep_dtype(adopt_storage(view.storage()));
  }
  if (view.sizes() != original.sizes() || view.strides() != original.strides() ||
      view.storage_offset() != original.storage_offset()) {
    impl->set_sizes_and_strides(view.sizes(), view.strides(), view.storage_offset());
  }
}

at::Tensor to_device(const at::Tensor& t, const Converted& seen) {
  if (!t.defined() || is_hpu(t)) {
    return t;
  }
  for (const auto& [view, original] : seen.hpu_of_view) {
    if (t.unsafeGetTensorImpl() == view.unsafeGetTensorImpl()) {
      return original;
    }
  }
  for (const auto& storage : seen.storages) {
    if (t.storage().data() == storage.data()) {
      return on_storage(storage, t);
    }
  }
  return adopt(t);
}

c10::IValue result_to_device(const c10::IValue& iv, const Converted& seen) {
  if (iv.isTensor()) {
    return to_device(iv.toTensor(), seen);
  }
  if (iv.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : iv.toTensorList().vec()) {
      list.push_back(to_device(t, seen));
    }
    return list;
  }
  if (is_list_of_lists(iv)) {
    c10::impl::GenericList list(iv.toList().elementType());
    for (const c10::IValue& item : iv.toList().vec()) {
      list.push_back(result_to_device(item, seen));
    }
    return list;
  }
  return iv;
}

bool is_collective(const c10::OperatorHandle& op) {
  return op.operator_name().name.rfind("c10d::", 0) == 0;
}

// Collectives in lazy mode: with PT_HPU_ENABLE_LAZY_COLLECTIVES they join the
// lazy graph; without, ProcessGroupHCCL::collective runs the pending graph first
// and refuses to run inside an HPU graph capture (bridge v1.19.0,
// ProcessGroupHCCL.cpp:461-472).
void before_collective() {
  std::lock_guard<std::mutex> lock(g_graphs.mutex);
  if (!g_graphs.lazy || g_graphs.lazy_collectives) {
    return;
  }
  TORCH_CHECK(
      !g_graphs.capturing, "collective nonSFG is not supported during hpu graph capturing");
  step_locked();
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto num_args = op.schema().arguments().size();
  const auto first = stack->size() - num_args;
  Converted seen;
  const bool computes = !moves_bytes(op);
  for (size_t i = first; i < stack->size(); ++i) {
    (*stack)[i] = arg_to_host((*stack)[i], seen, computes);
  }
  TORCH_CHECK(
      !(seen.saw_hpu && seen.saw_host_array) || is_collective(op),
      "Expected all tensors to be on the same device, but found at least two "
      "devices, hpu:0 and cpu! (",
      op.operator_name(),
      ")");
  if (is_collective(op)) {
    before_collective();
  }
  torch::jit::Stack args(stack->begin() + first, stack->end());
  note_operator(hash_inputs(op, args));
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  for (const auto& [view, original] : seen.hpu_of_view) {
    follow_resize(view, original);
  }
  const auto num_returns = op.schema().returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    (*stack)[i] = result_to_device((*stack)[i], seen);
  }
}

at::Tensor adopt_op(const at::Tensor& cpu) {
  return adopt(cpu.contiguous());
}

}  // namespace hpu_double

namespace at {
using HPUHooks = hpu_double::HpuHooks;
REGISTER_HPU_HOOKS(HPUHooks);
}  // namespace at

TORCH_LIBRARY_IMPL(aten, HPU, m) {
  m.impl("empty.memory_format", hpu_double::empty_memory_format);
  m.impl("empty_strided", hpu_double::empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("resize_", hpu_double::resize_);
  m.impl("set_.source_Storage_storage_offset", hpu_double::set_storage);
  m.impl("set_.source_Storage", hpu_double::set_source_storage);
  m.impl("set_.source_Tensor", hpu_double::set_source_tensor);
  m.impl("_copy_from", hpu_double::copy_from);
  m.impl("_copy_from_and_resize", hpu_double::copy_from_and_resize);
  m.impl("_local_scalar_dense", hpu_double::local_scalar_dense);
}

TORCH_LIBRARY_IMPL(_, HPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&hpu_double::fallback>());
}

TORCH_LIBRARY(hpu_double, m) {
  m.def("host_view(Tensor self) -> Tensor");
  m.def("adopt(Tensor self) -> Tensor");
  m.impl("host_view", c10::DispatchKey::HPU, hpu_double::host_view);
  m.impl("adopt", c10::DispatchKey::CPU, hpu_double::adopt_op);
}

// ------------------------------------------------------- C interface ----

extern "C" {

void hpu_double_configure(
    int device_count,
    int64_t memory_limit,
    int lazy,
    int lazy_collectives,
    double fp8_e4m3_max) {
  hpu_double::g_device_count.store(device_count);
  hpu_double::g_fp8_e4m3_max.store(fp8_e4m3_max);
  std::lock_guard<std::mutex> lock(hpu_double::g_memory.mutex);
  hpu_double::g_memory.limit = memory_limit;
  hpu_double::g_graphs.lazy = lazy != 0;
  hpu_double::g_graphs.lazy_collectives = lazy_collectives != 0;
}

void hpu_double_set_acquire_callback(hpu_double::AcquireCallback callback) {
  hpu_double::g_acquire_callback.store(callback);
}

// Acquires the card now (the bridge's hpu.init()); 0 when acquired.
int hpu_double_acquire(const char* why) {
  try {
    hpu_double::acquire(why);
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

int hpu_double_is_acquired() {
  return hpu_double::g_acquired.load() ? 1 : 0;
}

// limit, in_use, max_in_use, num_allocs, num_frees, active_allocs, max_alloc_size
void hpu_double_memory_stats(int64_t* out) {
  auto& m = hpu_double::g_memory;
  std::lock_guard<std::mutex> lock(m.mutex);
  int64_t values[] = {
      m.limit, m.in_use, m.max_in_use, m.num_allocs, m.num_frees, m.active_allocs, m.max_alloc_size};
  std::copy(std::begin(values), std::end(values), out);
}

void hpu_double_reset_peak_memory() {
  auto& m = hpu_double::g_memory;
  std::lock_guard<std::mutex> lock(m.mutex);
  m.max_in_use = m.in_use;
}

void hpu_double_reset_accumulated_memory() {
  auto& m = hpu_double::g_memory;
  std::lock_guard<std::mutex> lock(m.mutex);
  m.num_allocs = 0;
  m.num_frees = 0;
}

void hpu_double_mark_step() {
  std::lock_guard<std::mutex> lock(hpu_double::g_graphs.mutex);
  hpu_double::step_locked();
}

// compilations, steps, pending_ops
void hpu_double_graph_stats(int64_t* out) {
  auto& g = hpu_double::g_graphs;
  std::lock_guard<std::mutex> lock(g.mutex);
  out[0] = g.compilations;
  out[1] = g.steps;
  out[2] = g.pending_ops;
}

// Counts one compiled graph (an HPU graph capture, a torch.compile graph).
void hpu_double_count_compilation() {
  std::lock_guard<std::mutex> lock(hpu_double::g_graphs.mutex);
  hpu_double::g_graphs.compilations += 1;
}

// Operators run by a replay or a compiled graph are no new recipes.
void hpu_double_pause_counting(int pause) {
  std::lock_guard<std::mutex> lock(hpu_double::g_graphs.mutex);
  hpu_double::g_graphs.paused += pause ? 1 : -1;
}

void hpu_double_set_capturing(int capturing) {
  std::lock_guard<std::mutex> lock(hpu_double::g_graphs.mutex);
  hpu_double::g_graphs.capturing = capturing != 0;
}

void hpu_double_note_operator(const char* name) {
  hpu_double::note_operator(std::hash<std::string>{}(name));
}

}  // extern "C"
