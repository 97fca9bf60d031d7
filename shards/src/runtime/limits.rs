//! The process's open-file limit: raised from the soft to the hard limit at start (as the Go
//! runtime does for every Go program), and read by whoever sizes a cache of sockets.
#![allow(unsafe_code)]

/// Raises the soft open-file limit to the hard one. Returns the soft limit now in force, or the
/// error of the call that failed (the limit is then left as it was).
pub fn raise_open_files() -> std::io::Result<u64> {
    let mut limit = read()?;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid, initialised `rlimit` that the call only reads.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur as u64)
}

/// The soft open-file limit.
pub fn open_files() -> std::io::Result<u64> {
    Ok(read()?.rlim_cur as u64)
}

fn read() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid `rlimit` the call writes into; nothing else aliases it.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_leaves_the_soft_limit_at_the_hard_one() {
        let raised = raise_open_files().unwrap();
        assert_eq!(open_files().unwrap(), raised);
        assert_eq!(raised as libc::rlim_t, read().unwrap().rlim_max);
    }
}
