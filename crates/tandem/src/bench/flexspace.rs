//! FlexSpace's FlexFile, the peer of `bench flex`, loaded at run time from a shared library
//! that the user builds from its authors' repository (`flexible-address-space/flexspace`;
//! docs/BENCHMARKS.md gives the steps). Nothing of FlexSpace is in this repository: the library
//! is opened with dlopen from the path in `TANDEM_FLEXSPACE_LIB`, and the calls of its
//! `flexfile.h` are looked up by name. The signatures below are those of that header (x86-64
//! and aarch64 Linux: `u64` is `unsigned long`); every return value is checked.
//!
//! FlexFile calls `exit` when it cannot create its files; `FlexFile::create` therefore makes
//! the directory itself first, so that the common failures (no space, no permission) come back
//! as errors instead of ending the benchmark.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// The environment variable naming the library.
pub const LIBRARY_VARIABLE: &str = "TANDEM_FLEXSPACE_LIB";
/// Bytes appended per call while the starting file is made (FlexFile has no holes).
const FILL_PIECE_BYTES: usize = 4 << 20;

type OpenFunction = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type HandleFunction = unsafe extern "C" fn(*mut c_void);
type ReadFunction = unsafe extern "C" fn(*mut c_void, *mut c_void, c_ulong, c_ulong) -> isize;
type InsertFunction = unsafe extern "C" fn(*mut c_void, *const c_void, c_ulong, c_ulong) -> isize;
type CollapseFunction = unsafe extern "C" fn(*mut c_void, c_ulong, c_ulong) -> c_int;
type SizeFunction = unsafe extern "C" fn(*const c_void) -> c_ulong;

/// The loaded library's entry points. The library stays loaded for the life of the process
/// (FlexFile keeps thread-local cursors; unloading under them is not worth the risk).
pub struct FlexSpaceLibrary {
    pub path: PathBuf,
    open: OpenFunction,
    close: HandleFunction,
    sync: HandleFunction,
    read: ReadFunction,
    insert: InsertFunction,
    collapse: CollapseFunction,
    size: SizeFunction,
}

fn last_dl_error() -> String {
    // SAFETY: dlerror returns null or a C string valid until the next dl call in this thread.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        "no message".into()
    } else {
        // SAFETY: non-null, NUL-terminated, read before any other dl call.
        unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()
    }
}

impl FlexSpaceLibrary {
    /// The library named by `TANDEM_FLEXSPACE_LIB`: None when the variable is unset or empty,
    /// an error when it names something that is not a FlexFile library.
    pub fn from_environment() -> Result<Option<FlexSpaceLibrary>, String> {
        match std::env::var_os(LIBRARY_VARIABLE) {
            Some(path) if !path.is_empty() => FlexSpaceLibrary::load(Path::new(&path)).map(Some),
            _ => Ok(None),
        }
    }

    pub fn load(path: &Path) -> Result<FlexSpaceLibrary, String> {
        if !path.is_file() {
            return Err(format!("{LIBRARY_VARIABLE}={}: no such file", path.display()));
        }
        let text = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{LIBRARY_VARIABLE}: the path holds a NUL byte"))?;
        // SAFETY: dlopen with a valid C string; the library's initialisers run here, which is
        // what loading a library the user named means.
        let handle = unsafe { libc::dlopen(text.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("cannot load {}: {}", path.display(), last_dl_error()));
        }
        let symbol = |name: &str| -> Result<*mut c_void, String> {
            let name_text = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: a valid handle and C string.
            let address = unsafe { libc::dlsym(handle, name_text.as_ptr()) };
            if address.is_null() {
                Err(format!("{} has no {name} (not a FlexFile library?): {}", path.display(), last_dl_error()))
            } else {
                Ok(address)
            }
        };
        // SAFETY: each symbol is the function flexfile.h declares with exactly this signature.
        unsafe {
            Ok(FlexSpaceLibrary {
                path: path.to_path_buf(),
                open: std::mem::transmute::<*mut c_void, OpenFunction>(symbol("flexfile_open")?),
                close: std::mem::transmute::<*mut c_void, HandleFunction>(symbol("flexfile_close")?),
                sync: std::mem::transmute::<*mut c_void, HandleFunction>(symbol("flexfile_sync")?),
                read: std::mem::transmute::<*mut c_void, ReadFunction>(symbol("flexfile_read")?),
                insert: std::mem::transmute::<*mut c_void, InsertFunction>(symbol("flexfile_insert")?),
                collapse: std::mem::transmute::<*mut c_void, CollapseFunction>(symbol("flexfile_collapse")?),
                size: std::mem::transmute::<*mut c_void, SizeFunction>(symbol("flexfile_size")?),
            })
        }
    }
}

/// One open FlexFile in a directory of its own (FlexFile keeps DATA, FLEXTREE and LOG there),
/// closed and removed when dropped.
pub struct FlexFile<'library> {
    library: &'library FlexSpaceLibrary,
    handle: *mut c_void,
    directory: PathBuf,
}

impl<'library> FlexFile<'library> {
    /// A fresh FlexFile in `directory` (which must not exist) holding `bytes` zeros, synced.
    pub fn create(
        library: &'library FlexSpaceLibrary,
        directory: &Path,
        bytes: u64,
    ) -> Result<FlexFile<'library>, String> {
        let _ = std::fs::remove_dir_all(directory);
        std::fs::create_dir(directory).map_err(|error| format!("cannot create {}: {error}", directory.display()))?;
        let text = CString::new(directory.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{}: the path holds a NUL byte", directory.display()))?;
        // SAFETY: a valid C string; FlexFile copies the path.
        let handle = unsafe { (library.open)(text.as_ptr()) };
        if handle.is_null() {
            let _ = std::fs::remove_dir_all(directory);
            return Err(format!("flexfile_open({}) failed", directory.display()));
        }
        let mut file = FlexFile { library, handle, directory: directory.to_path_buf() };
        let zeros = vec![0u8; FILL_PIECE_BYTES];
        let mut filled = 0;
        while filled < bytes {
            let length = (bytes - filled).min(FILL_PIECE_BYTES as u64) as usize;
            file.insert(filled, &zeros[..length])?;
            filled += length as u64;
            crate::interrupt::check()?;
        }
        file.sync();
        let size = file.size();
        if size != bytes {
            return Err(format!("FlexFile holds {size} bytes after filling {bytes}"));
        }
        Ok(file)
    }

    pub fn insert(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        // SAFETY: the handle is open; FlexFile reads `data.len()` bytes of `data`.
        let inserted = unsafe {
            (self.library.insert)(self.handle, data.as_ptr().cast(), offset as c_ulong, data.len() as c_ulong)
        };
        if inserted != data.len() as isize {
            return Err(format!("flexfile_insert at {offset} of {} bytes returned {inserted}", data.len()));
        }
        Ok(())
    }

    pub fn collapse(&mut self, offset: u64, length: u64) -> Result<(), String> {
        // SAFETY: the handle is open.
        let result = unsafe { (self.library.collapse)(self.handle, offset as c_ulong, length as c_ulong) };
        if result != 0 {
            return Err(format!("flexfile_collapse at {offset} of {length} bytes returned {result}"));
        }
        Ok(())
    }

    /// Fills `buffer` from `offset`; FlexFile returns the whole length or −1.
    pub fn read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), String> {
        // SAFETY: the handle is open; FlexFile writes at most `buffer.len()` bytes.
        let read = unsafe {
            (self.library.read)(self.handle, buffer.as_mut_ptr().cast(), offset as c_ulong, buffer.len() as c_ulong)
        };
        if read != buffer.len() as isize {
            return Err(format!("flexfile_read at {offset} of {} bytes returned {read}", buffer.len()));
        }
        Ok(())
    }

    /// Makes the data and the tree's log durable (flexfile_sync returns nothing).
    pub fn sync(&mut self) {
        // SAFETY: the handle is open.
        unsafe { (self.library.sync)(self.handle) }
    }

    pub fn size(&self) -> u64 {
        // SAFETY: the handle is open. (`unsigned long` is 64 bits on every target FlexFile
        // builds for: it manages 800 GB of address space.)
        unsafe { (self.library.size)(self.handle) }
    }

    /// Bytes of space FlexFile's data file holds (its blocks), if stat can tell.
    pub fn held_bytes(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.directory.join("DATA")).ok().map(|metadata| metadata.blocks() * 512)
    }
}

impl Drop for FlexFile<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle is open and is not used after this.
        unsafe { (self.library.close)(self.handle) };
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}
