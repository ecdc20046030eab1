//! The socket under hyper: writes as tokio's, except that a body slice of file-backed bytes
//! ([`skillbox_registry::zero_copy`]) goes out with `sendfile(2)` from its file.
//!
//! hyper queues a response's head and body as separate buffers and writes them with one
//! vectored write. When a queued buffer is file-backed, the buffers before it (the head) are
//! sent with `MSG_MORE`, so the kernel holds them for the body instead of sending a short
//! segment, and hyper's next write starts at the file-backed buffer, which `sendfile` sends
//! from the page cache. Both report bytes written exactly as a plain write would, so hyper's
//! bookkeeping (partial writes, the rest of a pipelined answer) is unchanged.

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::rt::TokioIo;
use nix::sys::socket::{MsgFlags, SockaddrStorage, sendmsg};
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// "More data follows" (not among nix's named flags), which holds a short head back until the
/// body joins it in one segment; and no `SIGPIPE` if the peer has gone, as std's own sends.
const HEAD_FLAGS: MsgFlags =
    MsgFlags::from_bits_retain(nix::libc::MSG_MORE).union(MsgFlags::MSG_NOSIGNAL);

/// Bytes this process sent with `sendfile` (`skillbox_zero_copy_bytes_total`).
pub(crate) static ZERO_COPY_BYTES: AtomicU64 = AtomicU64::new(0);

pub(crate) struct ZeroCopyIo {
    inner: TokioIo<TcpStream>,
}

impl ZeroCopyIo {
    pub(crate) fn new(stream: TcpStream) -> Self {
        ZeroCopyIo {
            inner: TokioIo::new(stream),
        }
    }

    /// Runs `op` once the socket is writable, again after each spurious readiness.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        mut op: impl FnMut(&TcpStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let stream = self.inner.inner();
        loop {
            ready!(stream.poll_write_ready(cx))?;
            match stream.try_io(Interest::WRITABLE, || op(stream)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
}

impl Read for ZeroCopyIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl Write for ZeroCopyIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let backed = bufs.iter().enumerate().find_map(|(i, b)| {
            skillbox_registry::zero_copy::backing_file(b).map(|(file, offset)| (i, file, offset))
        });
        match backed {
            None => Pin::new(&mut self.inner).poll_write_vectored(cx, bufs),
            // What precedes the file-backed buffer, held back by the kernel until it comes.
            Some((i, ..)) if i > 0 => self.poll_send(cx, |s| {
                sendmsg::<SockaddrStorage>(s.as_raw_fd(), &bufs[..i], &[], HEAD_FLAGS, None)
                    .map_err(io::Error::from)
            }),
            Some((_, file, offset)) => {
                let len = bufs[0].len();
                let sent = ready!(self.poll_send(cx, |s| {
                    let mut at = offset as nix::libc::off_t;
                    nix::sys::sendfile::sendfile(s, &*file, Some(&mut at), len)
                        .map_err(io::Error::from)
                }));
                match sent {
                    Ok(n) if n > 0 => {
                        ZERO_COPY_BYTES.fetch_add(n as u64, Ordering::Relaxed);
                        Poll::Ready(Ok(n))
                    }
                    // This socket or file cannot be sent from, or the file is shorter than its
                    // bytes: write the bytes themselves.
                    Ok(_) => Pin::new(&mut self.inner).poll_write_vectored(cx, &bufs[..1]),
                    Err(e) if cannot_sendfile(&e) => {
                        tracing::debug!(error = %e, "sendfile refused; writing the bytes");
                        Pin::new(&mut self.inner).poll_write_vectored(cx, &bufs[..1])
                    }
                    Err(e) => Poll::Ready(Err(e)),
                }
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `sendfile`'s refusals that say nothing about the connection.
fn cannot_sendfile(e: &io::Error) -> bool {
    use nix::errno::Errno;
    e.raw_os_error().is_some_and(|code| {
        [
            Errno::EINVAL,
            Errno::ENOSYS,
            Errno::EOPNOTSUPP,
            Errno::EOVERFLOW,
        ]
        .contains(&Errno::from_raw(code))
    })
}
