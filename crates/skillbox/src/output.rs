//! Standard output that tolerates a reader going away: `skillbox … | head -1` ends quietly
//! instead of panicking (as `println!` does on a closed pipe).

/// `println!` to standard output; a closed pipe ends the process quietly.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            $crate::output::write_failed(e);
        }
    }};
}

/// `print!` to standard output; a closed pipe ends the process quietly.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout().lock(), $($arg)*) {
            $crate::output::write_failed(e);
        }
    }};
}

/// Whether `e` says the reader of standard output went away.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Standard output failed: quietly ends the process when the reader went away (what a pipe
/// into `head` does), else says why.
pub fn write_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: cannot write to standard output: {e}");
    std::process::exit(2);
}
