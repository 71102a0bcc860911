//! The broker, in a child process: the parent's handle ([`Broker`]) and
//! the child's side ([`run`], this binary with `--broker PORT`).

use super::*;

/// The broker child: this binary run with `--broker PORT`. Its stdin is a
/// pipe from the demo: a line `open` admits every client; end of input (the
/// demo exited, however it exited) ends the broker, so none is left behind.
pub struct Broker {
    pub port: u16,
    pub child: Option<(Child, ChildStdin)>,
}

impl Broker {
    pub fn start(port: u16) -> Result<Broker, Failure> {
        let mut b = Broker { port, child: None };
        b.restart()?;
        let end = Instant::now() + BROKER_START_WAIT;
        while !b.accepting()? {
            if Instant::now() >= end {
                return fail(format!(
                    "the broker did not accept on port {port} within {} s",
                    BROKER_START_WAIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(b)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |(c, _)| c.id())
    }

    /// Starts a new child on the same port. Returns at once: callers wait
    /// for [`Broker::accepting`] while they keep the board stepping.
    pub fn restart(&mut self) -> Result<(), Failure> {
        self.kill();
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["--broker", &self.port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let Some(stdin) = child.stdin.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return fail("the broker child has no stdin");
        };
        self.child = Some((child, stdin));
        Ok(())
    }

    /// Whether the child accepts connections yet; an error once it exited.
    pub fn accepting(&mut self) -> Result<bool, Failure> {
        if let Some((c, _)) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            return fail(format!("the broker exited at start ({status})"));
        }
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        // Loopback: refused at once while nothing listens.
        Ok(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
    }

    /// Lets every client in (until now only the cloud was admitted).
    pub fn admit_all(&mut self) -> Result<(), Failure> {
        match self.child.as_mut() {
            Some((_, stdin)) => {
                stdin.write_all(b"open\n")?;
                stdin.flush()?;
                Ok(())
            }
            None => fail("no broker is running"),
        }
    }

    /// Kills the child: every connection drops at once, as when a broker
    /// host loses power.
    pub fn kill(&mut self) {
        if let Some((mut child, stdin)) = self.child.take() {
            drop(stdin);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn stop(&mut self) {
        self.kill();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

mod child {
    //! The child side: rumqttd on one loopback port, v4 only, no console
    //! and no metrics listener.

    use std::collections::HashMap;
    use std::io::BufRead;
    use std::process::ExitCode;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use rumqttd::{Broker, Config, RouterConfig};

    pub fn run(port: &str) -> ExitCode {
        let Ok(port) = port.parse::<u16>() else {
            eprintln!("demo broker: bad port {port:?}");
            return ExitCode::from(2);
        };
        let open = Arc::new(AtomicBool::new(false));
        let open2 = open.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(l) if l.trim() == "open" => open2.store(true, Ordering::SeqCst),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            // The demo is gone: so is its broker.
            std::process::exit(0);
        });
        // The sync tests' rumqttd listener, with a gate: not a lock
        // (loopback only, and passwords are not checked), it holds the hub
        // back until the cloud has subscribed.
        let mut server = testkit::broker::rumqttd::server("demo", port);
        server
            .connections
            .set_auth_handler(move |client_id: String, _user, _pass| {
                let open = open.clone();
                async move { open.load(Ordering::SeqCst) || client_id == super::CLOUD_CLIENT_ID }
            });
        let config = Config {
            id: 0,
            router: RouterConfig {
                max_connections: 16,
                max_outgoing_packet_count: 200,
                max_segment_size: 8 << 20,
                max_segment_count: 10,
                ..RouterConfig::default()
            },
            v4: Some(HashMap::from([("1".to_owned(), server)])),
            ..Config::default()
        };
        match Broker::new(config).start() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo broker: {e}");
                ExitCode::FAILURE
            }
        }
    }
}

pub use child::run;
