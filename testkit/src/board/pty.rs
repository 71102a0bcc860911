//! Pseudo-terminals for the serial tests.
//!
//! The hub opens the slave's path through tokio-serial exactly as production
//! opens `/dev/ttyAMA0` (termios, exclusive lock and all); the test plays the
//! board on the master side through [`Master`], an `AsyncRead + AsyncWrite`
//! over the non-blocking master descriptor.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::pty::openpty;
use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One pseudo-terminal: the master for the test, the slave's path for the hub.
pub struct Pty {
    pub master: Master,
    /// Held open for the pty's life, like a real UART that always exists:
    /// the hub may close and reopen its end without the master seeing a
    /// hangup in between.
    slave: OwnedFd,
    pub path: PathBuf,
}

impl Pty {
    /// A raw (no echo, no line editing) pseudo-terminal. Raw from the start,
    /// so bytes the board writes before the hub opens the port are not
    /// echoed back or cooked.
    pub fn open() -> Pty {
        let pty = openpty(None, None).expect("openpty");
        let mut t = tcgetattr(&pty.slave).expect("tcgetattr");
        cfmakeraw(&mut t);
        tcsetattr(&pty.slave, SetArg::TCSANOW, &t).expect("tcsetattr");
        let path = nix::unistd::ttyname(pty.slave.as_fd()).expect("ttyname");
        Pty {
            master: Master::wrap(pty.master),
            slave: pty.slave,
            path,
        }
    }

    /// The master, the slave descriptor to keep open, and the slave's path.
    pub fn into_parts(self) -> (Master, OwnedFd, PathBuf) {
        (self.master, self.slave, self.path)
    }
}

/// A symlink `link` -> the pty's path (like `/dev/serial/by-id/...`),
/// replacing whatever `link` pointed to.
pub fn point(link: &Path, target: &Path) {
    let tmp = link.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).expect("symlink");
    std::fs::rename(&tmp, link).expect("rename symlink");
}

/// The master side of a pty, as an async byte stream.
pub struct Master {
    fd: AsyncFd<OwnedFd>,
}

impl Master {
    /// Another program's terminal (`path`, e.g. the OSDP peer's pty), opened
    /// raw and non-blocking as the same kind of async byte stream: for a
    /// test that sits on a wire between two parties.
    pub fn open_tty(path: &Path) -> Master {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_NONBLOCK,
            nix::sys::stat::Mode::empty(),
        )
        .expect("open the terminal");
        let mut t = tcgetattr(&fd).expect("tcgetattr");
        cfmakeraw(&mut t);
        tcsetattr(&fd, SetArg::TCSANOW, &t).expect("tcsetattr");
        Master::wrap(fd)
    }

    /// Any pty descriptor (a master, or a slave a relay plays the far end
    /// of) as an async byte stream; made non-blocking here.
    // The workspace denies unsafe code; this one block is reviewed below.
    #[allow(unsafe_code)]
    pub fn wrap(fd: OwnedFd) -> Master {
        let flags = fcntl(&fd, FcntlArg::F_GETFL).expect("F_GETFL");
        let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
        fcntl(&fd, FcntlArg::F_SETFL(flags)).expect("F_SETFL");
        Master {
            // SAFETY: an OwnedFd is open until dropped, and the AsyncFd
            // owns it, so the descriptor stays the same file for the
            // AsyncFd's whole life.
            fd: unsafe { AsyncFd::register(fd) }.expect("AsyncFd"),
        }
    }
}

impl AsyncRead for Master {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard
                .try_io(|fd| nix::unistd::read(fd.get_ref(), unfilled).map_err(io::Error::from))
            {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), buf).map_err(io::Error::from))
            {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
