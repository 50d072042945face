//! `edgewatch-demo --keep`: after its report the demo prints the fleet page's address, and the
//! page keeps being served there, listing every machine of the run, until the demo is stopped
//! (Ctrl-C); then nothing answers there any more.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use edgewatch_demo::scenario::Plan;

/// Status line and body of `GET path` at `addr`.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

#[test]
fn with_keep_the_demo_prints_the_page_address_and_serves_it_until_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut demo = Command::new(env!("CARGO_BIN_EXE_edgewatch-demo"))
        .args(["--quick", "--keep", "--out"])
        .arg(dir.path().join("run"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(demo.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    let mut page = None;
    for line in lines {
        let line = line.unwrap();
        printed.push(line.clone());
        if let Some(rest) = line.strip_prefix("Fleet page: http://") {
            page = Some(
                rest.split('/')
                    .next()
                    .unwrap()
                    .parse::<SocketAddr>()
                    .unwrap(),
            );
            assert!(line.contains("until Ctrl-C"), "{line}");
            break;
        }
    }
    let Some(page) = page else {
        let _ = demo.kill();
        panic!("no page address printed:\n{}", printed.join("\n"));
    };
    assert!(
        printed
            .iter()
            .any(|l| l.contains(&format!("fleet page: http://{page}/"))),
        "the address is printed at set-up too:\n{}",
        printed.join("\n")
    );
    // After the report the page is still served, and lists the run's machines.
    let (status, overview) = get(page, "/");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(overview.contains("<h2>SLOs at "));
    let (status, machines) = get(page, "/machines");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let plan = Plan::new(Duration::from_secs(36)).unwrap();
    for machine in &plan.machines {
        assert!(
            machines.contains(&format!("data-machine=\"{}\"", machine.id)),
            "{} missing:\n{machines}",
            machine.id
        );
    }
    // Ctrl-C stops the demo, and the gateway with it.
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    unsafe {
        libc::kill(demo.id() as i32, libc::SIGINT);
    }
    demo.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&page, Duration::from_millis(200)).is_ok() {
        assert!(Instant::now() < deadline, "the page outlived the demo");
        std::thread::sleep(Duration::from_millis(100));
    }
}
