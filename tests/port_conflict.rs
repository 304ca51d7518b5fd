//! Two weir processes on one `listen` address: the second refuses to start
//! (exit 1, the address named) instead of silently taking part of the
//! traffic through SO_REUSEPORT — while the first one's own workers still
//! share the port. Real processes, real sockets.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::third_party::free_port;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Weir(Child);

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn weir(config: &std::path::Path, workers: &str) -> Weir {
    Weir(
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["run", "--config"])
            .arg(config)
            .args(["--workers", workers])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

fn get(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[test]
fn a_second_weir_on_the_same_port_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let (listen, admin, admin2) = (free_port(), free_port(), free_port());
    let config = |admin: u16| {
        format!(
            "[server]\nlisten = \"127.0.0.1:{listen}\"\nadmin = \"127.0.0.1:{admin}\"\n\n\
             [upstreams.a]\nurl = \"http://127.0.0.1:9\"\nhosts = [\"a\"]\n"
        )
    };
    let first_cfg = dir.path().join("first.toml");
    let second_cfg = dir.path().join("second.toml");
    std::fs::write(&first_cfg, config(admin)).unwrap();
    std::fs::write(&second_cfg, config(admin2)).unwrap();

    // The first, with two workers sharing the port through SO_REUSEPORT.
    let mut first = weir(&first_cfg, "2");
    // Up to 10 s, in 50 ms steps.
    let mut tries = 0;
    while get(admin).is_none_or(|r| !r.starts_with("HTTP/1.1 200")) {
        tries += 1;
        assert!(tries < 200, "the first weir did not start");
        assert!(
            first.0.try_wait().unwrap().is_none(),
            "the first weir exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The second exits 1 and says why.
    let mut second = weir(&second_cfg, "2");
    let mut tries = 0;
    let status = loop {
        if let Some(s) = second.0.try_wait().unwrap() {
            break s;
        }
        tries += 1;
        assert!(
            tries < 200,
            "the second weir is running on a port the first one holds"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    second
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "127.0.0.1:{listen} is already in use by another process"
        )),
        "{err}"
    );
    // The first still serves.
    assert!(first.0.try_wait().unwrap().is_none());
    let resp = get(listen).unwrap();
    assert!(resp.starts_with("HTTP/1.1 "), "{resp}");
}
