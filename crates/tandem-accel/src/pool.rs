//! Host buffers: pinned (page-locked, registered with every GPU context) when a GPU is
//! present, so copies to and from the device need no staging copy; plain heap otherwise.
//! [`BufferPool`] recycles them, because pinning memory is slow (it maps and locks pages).

use crate::cuda::CudaSystem;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

const ALIGNMENT_BYTES: usize = 4096;

enum Storage {
    Heap(Vec<u8>),
    Pinned { pointer: *mut u8, capacity: usize },
}

/// A host buffer of `len` bytes, pinned or not.
pub struct HostBuffer {
    storage: Storage,
    length: usize,
    pool: Option<Arc<PoolShared>>,
}

// SAFETY: the pinned pointer is owned exclusively by this buffer.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Pinned when `system` has a GPU and pinning succeeds, heap otherwise. Zero-filled.
    pub fn allocate(system: Option<&CudaSystem>, bytes: usize) -> Self {
        if let Some(system) = system {
            if let Some(buffer) = Self::pinned(system, bytes) {
                return buffer;
            }
        }
        Self::from_vec(vec![0u8; bytes])
    }

    fn pinned(system: &CudaSystem, bytes: usize) -> Option<Self> {
        let device = system.devices.first()?;
        device.bind_context().ok()?;
        let capacity = bytes.max(1).div_ceil(ALIGNMENT_BYTES) * ALIGNMENT_BYTES;
        let mut pointer = std::ptr::null_mut();
        // PORTABLE: pinned for every context, so any GPU can copy from it directly.
        let status = unsafe { sys::cuMemHostAlloc(&mut pointer, capacity, 0x01) };
        if status != sys::CUresult::CUDA_SUCCESS || pointer.is_null() {
            return None;
        }
        // SAFETY: fresh allocation of `capacity` bytes.
        unsafe { std::ptr::write_bytes(pointer as *mut u8, 0, capacity) };
        Some(Self { storage: Storage::Pinned { pointer: pointer as *mut u8, capacity }, length: bytes, pool: None })
    }

    pub fn from_vec(data: Vec<u8>) -> Self {
        let length = data.len();
        Self { storage: Storage::Heap(data), length, pool: None }
    }

    pub fn is_pinned(&self) -> bool {
        matches!(self.storage, Storage::Pinned { .. })
    }

    fn capacity(&self) -> usize {
        match &self.storage {
            Storage::Heap(vector) => vector.len(),
            Storage::Pinned { capacity, .. } => *capacity,
        }
    }

    /// Copies out into a plain vector.
    pub fn to_vec(&self) -> Vec<u8> {
        self.deref().to_vec()
    }
}

impl Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.storage {
            Storage::Heap(vector) => &vector[..self.length],
            // SAFETY: pointer valid for capacity ≥ length bytes while self lives.
            Storage::Pinned { pointer, .. } => unsafe { std::slice::from_raw_parts(*pointer, self.length) },
        }
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Heap(vector) => &mut vector[..self.length],
            // SAFETY: as above, and &mut self gives exclusive access.
            Storage::Pinned { pointer, .. } => unsafe { std::slice::from_raw_parts_mut(*pointer, self.length) },
        }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "HostBuffer({} bytes, {})", self.length, if self.is_pinned() { "pinned" } else { "heap" })
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let storage = std::mem::replace(&mut self.storage, Storage::Heap(Vec::new()));
        if let Some(pool) = self.pool.take() {
            if let Some(storage) = pool.give_back(storage) {
                release(storage);
            }
        } else {
            release(storage);
        }
    }
}

fn release(storage: Storage) {
    if let Storage::Pinned { pointer, .. } = storage {
        // SAFETY: allocated by cuMemHostAlloc; the driver needs no current context to free it.
        unsafe { sys::cuMemFreeHost(pointer as *mut std::ffi::c_void) };
    }
}

struct PoolShared {
    free: Mutex<(HashMap<usize, Vec<Storage>>, usize)>,
    maximum_cached_bytes: usize,
}

// SAFETY: Storage pointers are owned by the pool while cached.
unsafe impl Send for PoolShared {}
unsafe impl Sync for PoolShared {}

impl PoolShared {
    /// Keeps the storage for reuse when under the cap; otherwise hands it back to free.
    fn give_back(&self, storage: Storage) -> Option<Storage> {
        let capacity = match &storage {
            Storage::Heap(vector) => vector.len(),
            Storage::Pinned { capacity, .. } => *capacity,
        };
        let mut guard = self.free.lock().expect("pool poisoned");
        if guard.1 + capacity > self.maximum_cached_bytes {
            return Some(storage);
        }
        guard.1 += capacity;
        guard.0.entry(capacity).or_default().push(storage);
        None
    }
}

/// Recycles host buffers in power-of-two size classes, up to a cap of cached bytes.
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<PoolShared>,
    system: Option<Arc<CudaSystem>>,
}

impl BufferPool {
    pub fn new(system: Option<Arc<CudaSystem>>, maximum_cached_bytes: usize) -> Self {
        Self { shared: Arc::new(PoolShared { free: Mutex::new((HashMap::new(), 0)), maximum_cached_bytes }), system }
    }

    /// A buffer of exactly `bytes` bytes (contents unspecified when recycled).
    pub fn get(&self, bytes: usize) -> HostBuffer {
        let class = bytes.max(ALIGNMENT_BYTES).next_power_of_two();
        let cached = {
            let mut guard = self.shared.free.lock().expect("pool poisoned");
            let storage = guard.0.get_mut(&class).and_then(|list| list.pop());
            if storage.is_some() {
                guard.1 -= class;
            }
            storage
        };
        let mut buffer = match cached {
            Some(storage) => HostBuffer { storage, length: bytes, pool: None },
            None => {
                let mut buffer = HostBuffer::allocate(self.system.as_deref(), class);
                buffer.length = bytes;
                buffer
            }
        };
        debug_assert!(buffer.capacity() >= bytes);
        buffer.pool = Some(Arc::clone(&self.shared));
        buffer
    }

    pub fn is_pinned(&self) -> bool {
        self.system.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_recycles_within_the_cap() {
        let pool = BufferPool::new(None, 1 << 20);
        let first = pool.get(5000);
        assert_eq!(first.len(), 5000);
        drop(first);
        assert_eq!(pool.shared.free.lock().unwrap().1, 8192);
        let second = pool.get(6000);
        assert_eq!(second.len(), 6000);
        assert_eq!(pool.shared.free.lock().unwrap().1, 0);
        let large = pool.get(2 << 20);
        drop(large);
        // Over the cap: freed, not cached.
        assert_eq!(pool.shared.free.lock().unwrap().1, 0);
    }
}
