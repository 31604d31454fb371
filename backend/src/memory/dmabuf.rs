//! `--guest-memory dmabuf`: the guest's memory as host dma-bufs.
//!
//! A VMM shares guest RAM as memfds (QEMU's `memory-backend-memfd`, cloud-hypervisor's
//! `shared=on` memory). The kernel's udmabuf driver turns a range of a memfd into a dma-buf:
//! the same pages, as an object a device driver can import and DMA into (a NIC receive queue
//! bound with netdev `bind-rx`, a GPU, an accelerator). In this mode the daemon makes one
//! dma-buf per region of the guest's memory table, maps the dma-buf instead of the memfd, and
//! reads and writes every payload, completion and ring of the RDMA device through that mapping.
//! The dma-bufs are what a host device would be handed to reach the guest's memory without a
//! CPU copy (docs/decisions.md, "Devmem receive"); the daemon keeps them for as long as the
//! table stands.
//!
//! What udmabuf asks of a region (drivers/dma-buf/udmabuf.c, `check_memfd_seals` and
//! `udmabuf_create`): a memfd (shmem or hugetlbfs) sealed against shrinking (`F_SEAL_SHRINK`,
//! which QEMU's memfd backend sets by default, `seal=on`) and not against writing, a
//! page-aligned offset and size, and at most `size_limit_mb` (a module parameter, 64 MiB by
//! default) per dma-buf. A region that does not qualify fails the memory table with the reason
//! and what to change; nothing is mapped half.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};
use std::path::Path;
use std::sync::Arc;

use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap, MmapRegion,
};

use super::guest_mem::GuestMemoryMmap;

/// `/dev/udmabuf`'s path.
pub const UDMABUF_DEV: &str = "/dev/udmabuf";
/// The module parameter that bounds one dma-buf's size.
const SIZE_LIMIT_PARAM: &str = "/sys/module/udmabuf/parameters/size_limit_mb";
/// `_IOW('u', 0x42, struct udmabuf_create)` (include/uapi/linux/udmabuf.h).
const UDMABUF_CREATE: libc::c_ulong = 0x4018_7542;
const UDMABUF_FLAGS_CLOEXEC: u32 = 1;
const PAGE: u64 = 4096;

/// `struct udmabuf_create`.
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// Why the guest's memory (or a probe buffer) cannot be a dma-buf.
#[derive(Debug, thiserror::Error)]
pub enum DmabufError {
    #[error(
        "--guest-memory dmabuf: cannot open {UDMABUF_DEV}: {0} (load the udmabuf module: \
         `modprobe udmabuf`; the daemon's user needs read-write access to it)"
    )]
    Open(io::Error),
    #[error(
        "--guest-memory dmabuf: guest memory region {index} (GPA {gpa:#x}, {size} bytes) is not \
         a file mapping: the VMM must share its RAM as a memfd (QEMU: memory-backend-memfd)"
    )]
    NoFile { index: usize, gpa: u64, size: u64 },
    #[error(
        "--guest-memory dmabuf: guest memory region {index} (GPA {gpa:#x}) is not a memfd \
         ({0}); udmabuf takes memfds only (QEMU: memory-backend-memfd, not memory-backend-file)",
        .err
    )]
    NotMemfd {
        index: usize,
        gpa: u64,
        err: io::Error,
    },
    #[error(
        "--guest-memory dmabuf: guest memory region {index} (GPA {gpa:#x}) is a memfd not sealed \
         against shrinking (seals {seals:#x}): udmabuf needs F_SEAL_SHRINK (QEMU: \
         memory-backend-memfd with seal=on, its default)"
    )]
    NotSealed { index: usize, gpa: u64, seals: i32 },
    #[error(
        "--guest-memory dmabuf: guest memory region {index} (GPA {gpa:#x}) is a memfd sealed \
         against writing (seals {seals:#x}); udmabuf refuses it"
    )]
    WriteSealed { index: usize, gpa: u64, seals: i32 },
    #[error(
        "--guest-memory dmabuf: guest memory region {index} (GPA {gpa:#x}) starts at offset \
         {offset:#x} of its memfd and is {size} bytes: udmabuf needs both page-aligned"
    )]
    Unaligned {
        index: usize,
        gpa: u64,
        offset: u64,
        size: u64,
    },
    #[error(
        "--guest-memory dmabuf: guest memory region {index} (GPA {gpa:#x}) is {mib} MiB, above \
         udmabuf's size_limit_mb of {limit}: raise it (`echo {mib} > {SIZE_LIMIT_PARAM}`, or \
         `modprobe udmabuf size_limit_mb={mib}`)"
    )]
    TooLarge {
        index: usize,
        gpa: u64,
        mib: u64,
        limit: u64,
    },
    #[error(
        "--guest-memory dmabuf: udmabuf refused guest memory region {index} (GPA {gpa:#x}): {err}"
    )]
    Create {
        index: usize,
        gpa: u64,
        err: io::Error,
    },
    #[error("--guest-memory dmabuf: mapping the dma-buf of guest memory region {index} (GPA {gpa:#x}): {err}")]
    Map { index: usize, gpa: u64, err: String },
    #[error("--guest-memory dmabuf: a probe buffer: {0}")]
    Probe(io::Error),
}

/// The dma-buf of one guest memory region.
pub struct RegionBuf {
    /// Guest-physical address of its first byte.
    pub gpa: u64,
    pub size: u64,
    /// The dma-buf (shared with the mapping that reads and writes it).
    pub fd: Arc<File>,
}

/// The guest's memory as dma-bufs: the mapping the device uses, and the dma-bufs under it.
pub struct DmabufRam {
    pub mem: GuestMemoryMmap,
    pub regions: Vec<RegionBuf>,
}

/// `/dev/udmabuf`, opened at start (before the daemon gives up its privileges and installs
/// its system-call filter), and the size limit its module was loaded with.
pub struct Udmabuf {
    dev: File,
    /// Where the module says its `size_limit_mb` (read again for every table: root may change
    /// it while the daemon runs).
    limit_param: std::path::PathBuf,
}

impl Udmabuf {
    /// Opens `/dev/udmabuf`; an error says how to get it.
    pub fn open() -> Result<Udmabuf, DmabufError> {
        Self::open_at(Path::new(UDMABUF_DEV), Path::new(SIZE_LIMIT_PARAM))
    }

    fn open_at(dev: &Path, limit: &Path) -> Result<Udmabuf, DmabufError> {
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dev)
            .map_err(DmabufError::Open)?;
        Ok(Udmabuf {
            dev,
            limit_param: limit.to_path_buf(),
        })
    }

    /// `size_limit_mb` of the module now, when it says.
    pub fn limit_mib(&self) -> Option<u64> {
        std::fs::read_to_string(&self.limit_param)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// A dma-buf over `size` bytes of `memfd` from `offset`.
    fn create(&self, memfd: BorrowedFd<'_>, offset: u64, size: u64) -> io::Result<File> {
        let arg = UdmabufCreate {
            memfd: memfd.as_raw_fd() as u32,
            flags: UDMABUF_FLAGS_CLOEXEC,
            offset,
            size,
        };
        // SAFETY: UDMABUF_CREATE reads one `struct udmabuf_create`, which `arg` is, live for
        // the call; it returns a new fd or -1.
        let fd = unsafe { libc::ioctl(self.dev.as_raw_fd(), UDMABUF_CREATE, &arg) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd the kernel just gave us, owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// The guest's memory `mem` again, every region mapped through a dma-buf of its memfd.
    /// Checks every region before it creates any dma-buf, so that a table that cannot be
    /// served fails whole, with the first region's reason.
    pub fn remap(&self, mem: &GuestMemoryMmap) -> Result<DmabufRam, DmabufError> {
        let mut plan = Vec::new();
        let limit_mib = self.limit_mib();
        for (index, r) in mem.iter().enumerate() {
            let gpa = r.start_addr().0;
            let size = r.len();
            let fo = r
                .file_offset()
                .ok_or(DmabufError::NoFile { index, gpa, size })?;
            check(limit_mib, index, gpa, fo, size)?;
            plan.push((index, gpa, size, fo.file(), fo.start()));
        }
        let mut regions = Vec::new();
        let mut mapped = Vec::new();
        for (index, gpa, size, file, offset) in plan {
            let buf = self
                .create(file.as_fd(), offset, size)
                .map_err(|err| DmabufError::Create { index, gpa, err })?;
            let buf = Arc::new(buf);
            let map = |err: String| DmabufError::Map { index, gpa, err };
            let region =
                MmapRegion::<()>::from_file(FileOffset::from_arc(buf.clone(), 0), size as usize)
                    .map_err(|e| map(e.to_string()))?;
            let region = GuestRegionMmap::new(region, GuestAddress(gpa))
                .ok_or_else(|| map("the region's end overflows".into()))?;
            mapped.push(region);
            regions.push(RegionBuf { gpa, size, fd: buf });
        }
        let mem = GuestMemoryMmap::from_regions(mapped).map_err(|e| DmabufError::Map {
            index: 0,
            gpa: 0,
            err: e.to_string(),
        })?;
        Ok(DmabufRam { mem, regions })
    }

    /// A dma-buf of `size` bytes of a memfd of its own (zeroed), for probing what a host
    /// device can do with one before the guest's memory exists (`--devmem-rx`).
    pub fn probe_buffer(&self, size: u64) -> Result<File, DmabufError> {
        // SAFETY: a NUL-terminated name; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"vur-devmem-probe".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(DmabufError::Probe(io::Error::last_os_error()));
        }
        // SAFETY: a fresh fd owned by nobody else.
        let memfd = unsafe { File::from_raw_fd(fd) };
        memfd.set_len(size).map_err(DmabufError::Probe)?;
        // SAFETY: F_ADD_SEALS with an int argument on our fd.
        if unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } != 0 {
            return Err(DmabufError::Probe(io::Error::last_os_error()));
        }
        self.create(memfd.as_fd(), 0, size)
            .map_err(DmabufError::Probe)
    }
}

/// What udmabuf will check of region `index`, checked first for a clearer answer.
fn check(
    limit_mib: Option<u64>,
    index: usize,
    gpa: u64,
    fo: &FileOffset,
    size: u64,
) -> Result<(), DmabufError> {
    // SAFETY: F_GET_SEALS on an fd we hold; no memory is passed.
    let seals = unsafe { libc::fcntl(fo.file().as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        let err = io::Error::last_os_error();
        return Err(DmabufError::NotMemfd { index, gpa, err });
    }
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err(DmabufError::NotSealed { index, gpa, seals });
    }
    if seals & (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0 {
        return Err(DmabufError::WriteSealed { index, gpa, seals });
    }
    let offset = fo.start();
    if !offset.is_multiple_of(PAGE) || !size.is_multiple_of(PAGE) || size == 0 {
        return Err(DmabufError::Unaligned {
            index,
            gpa,
            offset,
            size,
        });
    }
    if let Some(limit) = limit_mib {
        let mib = size.div_ceil(1 << 20);
        if mib > limit {
            return Err(DmabufError::TooLarge {
                index,
                gpa,
                mib,
                limit,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_device_says_how_to_get_it() {
        let e = Udmabuf::open_at(Path::new("/nonexistent/udmabuf"), Path::new("/nonexistent"))
            .err()
            .expect("no device");
        let s = e.to_string();
        assert!(s.contains("modprobe udmabuf"), "{s}");
        assert!(s.contains(UDMABUF_DEV), "{s}");
    }

    #[test]
    fn the_ioctl_number_is_udmabuf_create() {
        // _IOW('u', 0x42, 24 bytes): direction write (1) << 30, size << 16, type << 8, nr.
        let want = (1u64 << 30)
            | ((std::mem::size_of::<UdmabufCreate>() as u64) << 16)
            | ((b'u' as u64) << 8)
            | 0x42;
        assert_eq!(std::mem::size_of::<UdmabufCreate>(), 24);
        assert_eq!(UDMABUF_CREATE, want);
    }

    fn memfd(size: u64, seals: i32) -> Arc<File> {
        // SAFETY: a NUL-terminated name; checked.
        let fd = unsafe {
            libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        assert!(fd >= 0);
        // SAFETY: fresh fd.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(size).unwrap();
        if seals != 0 {
            // SAFETY: F_ADD_SEALS with an int on our fd.
            let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) };
            assert_eq!(r, 0);
        }
        Arc::new(f)
    }

    /// Each of udmabuf's conditions, checked before the ioctl, with what to change.
    #[test]
    fn regions_udmabuf_would_refuse_are_named_with_the_reason() {
        let at = |f: &Arc<File>, off| FileOffset::from_arc(f.clone(), off);
        let sealed = memfd(1 << 20, libc::F_SEAL_SHRINK);
        assert!(check(Some(64), 0, 0x4000_0000, &at(&sealed, 0), 1 << 20).is_ok());
        let e = check(None, 1, 0x1000, &at(&memfd(1 << 20, 0), 0), 1 << 20).unwrap_err();
        assert!(matches!(e, DmabufError::NotSealed { index: 1, .. }), "{e}");
        assert!(e.to_string().contains("seal=on"), "{e}");
        let ws = memfd(1 << 20, libc::F_SEAL_SHRINK | libc::F_SEAL_WRITE);
        let e = check(None, 0, 0, &at(&ws, 0), 1 << 20).unwrap_err();
        assert!(matches!(e, DmabufError::WriteSealed { .. }), "{e}");
        let e = check(None, 0, 0, &at(&sealed, 512), 4096).unwrap_err();
        assert!(
            matches!(e, DmabufError::Unaligned { offset: 512, .. }),
            "{e}"
        );
        let e = check(None, 0, 0, &at(&sealed, 0), 4097).unwrap_err();
        assert!(matches!(e, DmabufError::Unaligned { .. }), "{e}");
        let e = check(Some(1), 2, 0x8000_0000, &at(&sealed, 0), 2 << 20).unwrap_err();
        assert!(
            matches!(
                e,
                DmabufError::TooLarge {
                    index: 2,
                    mib: 2,
                    limit: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("size_limit_mb"), "{e}");
        // A file that is not a memfd (a directory's fd: no seals at all).
        let dir = Arc::new(File::open("/").unwrap());
        let e = check(None, 0, 0, &at(&dir, 0), 4096).unwrap_err();
        assert!(matches!(e, DmabufError::NotMemfd { .. }), "{e}");
    }
}
