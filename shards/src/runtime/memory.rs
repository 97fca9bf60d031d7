//! Giving memory back to the system. Connections that go idle give back their buffers (an
//! HTTP/2 connection's frame buffers, `http2::server`), but glibc's `free` keeps the pages of
//! a chunk freed in the middle of the heap: the process's resident memory would not shrink
//! until new allocations reused them. So a shard that freed such buffers asks for a trim, and
//! its periodic sweep makes it (`malloc_trim`, which returns every whole free page of every
//! arena), at most once per sweep and never on the request path.

use std::cell::Cell;

thread_local! {
    /// Buffers were given back on this shard since its last trim.
    static RELEASED: Cell<bool> = const { Cell::new(false) };
}

/// Notes that this shard freed memory worth returning to the system.
pub fn released() {
    RELEASED.with(|released| released.set(true));
}

/// Returns the free pages to the system if this shard freed buffers since the last call.
/// True when it trimmed.
pub fn trim_if_released() -> bool {
    if !RELEASED.with(|released| released.replace(false)) {
        return false;
    }
    trim();
    true
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // one libc call that takes no pointer, see below
fn trim() {
    // SAFETY: malloc_trim takes no pointer and is thread-safe (it locks each arena in turn).
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

/// What [`unmap_clean_file_pages`] gave back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unmapped {
    /// Mappings the process asked the kernel to unmap pages of.
    pub mappings: usize,
    /// Their resident kilobytes before.
    pub resident_kib: u64,
}

/// Unmaps the pages of read-only file mappings (the binary's and the libraries' code and
/// constants) from this process. Start-up runs code no request ever runs again (argument and
/// environment parsing, the configuration, binding, spawning), and the kernel maps code in
/// 64 KiB windows around each page touched: once start-up is over, most of the resident code is
/// code that will not run again. The pages stay in the page cache, clean and shared; the code a
/// request runs is mapped back on its first use (a minor fault, no I/O).
///
/// Only mappings that are readable, not writable and hold no anonymous page (`smaps`'
/// `Anonymous: 0 kB`) are touched: a relocated page (RELRO) is anonymous and would revert to the
/// file's bytes. `smaps` is the text of `/proc/self/smaps`.
pub fn unmap_clean_file_pages(smaps: &str) -> Unmapped {
    let mut unmapped = Unmapped::default();
    for mapping in clean_file_mappings(smaps) {
        if advise_dont_need(mapping.start, mapping.end) {
            unmapped.mappings += 1;
            unmapped.resident_kib += mapping.resident_kib;
        }
    }
    unmapped
}

/// A mapping that [`unmap_clean_file_pages`] may unmap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CleanMapping {
    start: usize,
    end: usize,
    resident_kib: u64,
}

/// The mappings of `smaps` that are file-backed, read-only, private, resident and hold no
/// anonymous page.
fn clean_file_mappings(smaps: &str) -> Vec<CleanMapping> {
    // Each mapping as its header line found it (and whether it qualifies so far); the field
    // lines below a header fill in the last one.
    let mut mappings: Vec<(CleanMapping, bool)> = Vec::new();
    for line in smaps.lines() {
        if let Some(header) = mapping_header(line) {
            mappings.push(header);
        } else if let Some((mapping, qualifies)) = mappings.last_mut() {
            if let Some(kib) = field_kib(line, "Rss:") {
                mapping.resident_kib = kib;
            } else if let Some(kib) = field_kib(line, "Anonymous:") {
                *qualifies &= kib == 0;
            } else if let Some(flags) = line.strip_prefix("VmFlags:") {
                // Locked pages cannot be unmapped this way.
                *qualifies &= !flags.split_whitespace().any(|flag| flag == "lo");
            }
        }
    }
    mappings
        .into_iter()
        .filter(|(mapping, qualifies)| *qualifies && mapping.resident_kib > 0)
        .map(|(mapping, _)| mapping)
        .collect()
}

/// `start-end perms offset dev inode path`: the range, and whether it is a read-only private
/// mapping of a file (a path, not `[vdso]` or `[heap]`).
fn mapping_header(line: &str) -> Option<(CleanMapping, bool)> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    let (_offset, _device, inode) = (fields.next()?, fields.next()?, fields.next()?);
    let path = fields.next().unwrap_or("");
    let perms = perms.as_bytes();
    let read_only_private =
        perms.len() == 4 && perms[0] == b'r' && perms[1] == b'-' && perms[3] == b'p';
    let file = inode != "0" && path.starts_with('/');
    Some((
        CleanMapping {
            start,
            end,
            resident_kib: 0,
        },
        read_only_private && file && start < end,
    ))
}

fn field_kib(line: &str, name: &str) -> Option<u64> {
    let value = line.strip_prefix(name)?.trim();
    value.strip_suffix("kB")?.trim().parse().ok()
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // one madvise on a range the kernel listed as a mapping of this process
fn advise_dont_need(start: usize, end: usize) -> bool {
    // SAFETY: the range is a whole read-only private file mapping of this process with no
    // anonymous page (checked by the caller from smaps): MADV_DONTNEED only drops its page table
    // entries, and the next access maps the same file bytes again. No Rust reference can see
    // a difference.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn advise_dont_need(_start: usize, _end: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d4a0000000-55d4a0200000 r--p 00000000 fe:00 1234 /usr/bin/kactivator
Size:               2048 kB
Rss:                 760 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
55d4a0200000-55d4a0c00000 r-xp 00200000 fe:00 1234 /usr/bin/kactivator
Size:              10240 kB
Rss:                2500 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me sd
55d4a0c00000-55d4a0c55000 r--p 00c00000 fe:00 1234 /usr/bin/kactivator
Size:                340 kB
Rss:                 340 kB
Anonymous:           340 kB
VmFlags: rd mr mw me ac sd
55d4a0c55000-55d4a0c5a000 rw-p 00c55000 fe:00 1234 /usr/bin/kactivator
Size:                 20 kB
Rss:                  20 kB
Anonymous:            20 kB
VmFlags: rd wr mr mw me ac sd
7f0000000000-7f0000100000 r--p 00000000 00:00 0
Size:               1024 kB
Rss:                  12 kB
Anonymous:            12 kB
VmFlags: rd mr mw me sd
7f1000000000-7f1000100000 r-xp 00028000 fe:00 99 /usr/lib/x86_64-linux-gnu/libc.so.6
Size:               1024 kB
Rss:                 948 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me lo sd
7f2000000000-7f2000010000 r-xp 00000000 fe:00 77 /usr/lib/libgcc_s.so.1
Size:                 64 kB
Rss:                   0 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me sd
7f3000000000-7f3000002000 r-xp 00000000 00:00 0 [vdso]
Size:                  8 kB
Rss:                   4 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me de sd
7f4000000000-7f4000010000 r--s 00000000 fe:00 55 /dev/shm/shared
Size:                 64 kB
Rss:                  64 kB
Anonymous:             0 kB
VmFlags: rd mr me ms sd
7f5000000000-7f5000001000 r-xp 00000000 fe:00 56 /opt/lib/with space.so
Size:                  4 kB
Rss:                   4 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me sd
";

    #[test]
    fn only_resident_read_only_private_file_mappings_without_anonymous_pages_qualify() {
        let found = clean_file_mappings(SMAPS);
        let ranges: Vec<(usize, usize, u64)> = found
            .iter()
            .map(|mapping| (mapping.start, mapping.end, mapping.resident_kib))
            .collect();
        // The binary's constants and code; not its relocated constants (anonymous), its data
        // (writable), an anonymous mapping, locked code, code not resident, the vDSO, or a
        // shared mapping. A path with a space is still a path.
        assert_eq!(
            ranges,
            vec![
                (0x55d4a0000000, 0x55d4a0200000, 760),
                (0x55d4a0200000, 0x55d4a0c00000, 2500),
                (0x7f5000000000, 0x7f5000001000, 4),
            ]
        );
    }

    #[test]
    fn malformed_smaps_text_finds_nothing_and_does_not_panic() {
        for text in [
            "",
            "garbage\nRss: 12 kB\n",
            "zz-yy r--p 0 fe:00 1 /a\nRss: 4 kB\nAnonymous: 0 kB\n",
            "1000-2000 r--p\nRss: 4 kB\n",
            "2000-1000 r--p 0 fe:00 1 /a\nRss: 4 kB\nAnonymous: 0 kB\n",
            "1000-2000 r--p 0 fe:00 1 /a\nRss: lots kB\nAnonymous: 0 kB\n",
        ] {
            assert_eq!(clean_file_mappings(text), Vec::new(), "{text:?}");
        }
    }

    /// A file mapped and read is resident; unmapped, its pages leave this process's page table
    /// and the same bytes are read again afterwards.
    #[test]
    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn unmapped_pages_leave_the_page_table_and_read_back_the_same() {
        use std::io::{Read, Seek, SeekFrom, Write};
        const PAGES: usize = 64;
        let page = 4096;
        let mut file = tempfile_in_target();
        let pattern: Vec<u8> = (0..PAGES * page).map(|i| (i * 7 % 251) as u8).collect();
        file.write_all(&pattern).unwrap();
        file.flush().unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh private read-only mapping of a file this test owns and never writes.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGES * page,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let read = |base: *mut libc::c_void| -> Vec<u8> {
            // SAFETY: the mapping is PAGES pages long and stays mapped until munmap below.
            unsafe { std::slice::from_raw_parts(base as *const u8, PAGES * page) }.to_vec()
        };
        assert_eq!(read(base), pattern);
        let present = |base: *mut libc::c_void| -> usize {
            let mut pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
            pagemap
                .seek(SeekFrom::Start((base as u64 / page as u64) * 8))
                .unwrap();
            let mut entries = vec![0u8; PAGES * 8];
            pagemap.read_exact(&mut entries).unwrap();
            entries
                .chunks(8)
                .filter(|entry| u64::from_le_bytes((*entry).try_into().unwrap()) >> 63 == 1)
                .count()
        };
        assert_eq!(present(base), PAGES);

        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let unmapped = unmap_clean_file_pages(&smaps);
        assert!(unmapped.mappings >= 1 && unmapped.resident_kib >= (PAGES * 4) as u64);
        assert_eq!(present(base), 0, "the file's pages are still mapped");
        assert_eq!(read(base), pattern);
        assert_eq!(present(base), PAGES);
        // SAFETY: unmaps the mapping made above; nothing refers to it any more.
        assert_eq!(unsafe { libc::munmap(base, PAGES * page) }, 0);
    }

    /// A file under the build's target directory (a real file system: tmpfs pages would be
    /// shared memory, which the test does not look at).
    fn tempfile_in_target() -> std::fs::File {
        let dir = std::env::current_exe().unwrap();
        let dir = dir.parent().unwrap();
        let path = dir.join(format!("memory-unmap-test-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    #[test]
    fn a_trim_follows_a_release_once() {
        assert!(!trim_if_released());
        released();
        released();
        assert!(trim_if_released());
        assert!(!trim_if_released());
    }
}
