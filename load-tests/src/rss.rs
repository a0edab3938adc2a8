//! The server's resident memory, read from `/proc/PID/status` (Linux).

/// Resident set size of process `pid` in kibibytes, if it can be read.
pub fn resident_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss_and_this_process_has_some() {
        assert_eq!(
            parse_vm_rss("Name:\tagora\nVmRSS:\t  41236 kB\nThreads: 9\n"),
            Some(41_236)
        );
        assert_eq!(parse_vm_rss("Name:\tagora\n"), None);
        assert!(resident_kib(std::process::id()).is_some_and(|kib| kib > 0));
    }
}
