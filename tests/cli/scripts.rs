//! `scripts/test`, run with stand-ins for `systemctl`, `cargo`, `rustup`
//! and the OSDP venv's python on PATH (nothing is installed, stopped or
//! built for real): it says what it will do before doing it, and it
//! starts a system Mosquitto it stopped again, also when the tests fail.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn shim(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn scripts_test_says_its_plan_first_and_starts_a_mosquitto_it_stopped_again_even_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.path().join("calls.log");
    let log_s = log.display();
    // The system Mosquitto runs; every call is logged.
    shim(
        &bin,
        "systemctl",
        &format!("echo \"systemctl $*\" >> {log_s}\n[ \"$1\" = is-active ] && exit 0\nexit 0"),
    );
    shim(
        &bin,
        "rustup",
        &format!("echo \"rustup $*\" >> {log_s}\necho thumbv7em-none-eabihf"),
    );
    // clippy is there, and the lint run fails (as a failing suite would).
    shim(
        &bin,
        "cargo",
        &format!("echo \"cargo $*\" >> {log_s}\n[ \"$2\" = --version ] && exit 0\nexit 1"),
    );
    // Not root: `sudo` must not reach the real systemctl.
    shim(&bin, "sudo", "exec \"$@\"");
    // The OSDP venv is there already.
    let venv_bin = dir.path().join("target/osdp-venv/bin");
    std::fs::create_dir_all(&venv_bin).unwrap();
    shim(&venv_bin, "python", "exit 0");

    let script = testkit::repo_root().join("scripts/test");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let run = |args: &[&str]| {
        Command::new("bash")
            .arg(&script)
            .args(args)
            .env("PATH", &path)
            .env("CARGO_TARGET_DIR", dir.path().join("target"))
            .output()
            .unwrap()
    };

    // --plan: the plan, and nothing done.
    let out = run(&["--plan"]);
    assert!(out.status.success());
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.starts_with("scripts/test will:\n"), "{plan}");
    assert!(plan.contains("stop the system Mosquitto"), "{plan}");
    assert!(plan.contains("start it again at the end"), "{plan}");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!calls.contains("systemctl stop"), "{calls}");

    // A run whose cargo fails: stopped, then started again.
    std::fs::remove_file(&log).ok();
    let out = run(&[]);
    assert!(!out.status.success(), "the failing cargo fails the script");
    let said = String::from_utf8_lossy(&out.stdout);
    let plan_at = said.find("stop the system Mosquitto").expect("the plan");
    let stop_at = said.find("== stopping the system Mosquitto").expect("said");
    assert!(plan_at < stop_at, "the plan comes first: {said}");
    let calls = std::fs::read_to_string(&log).unwrap();
    let stop = calls.find("systemctl stop mosquitto").expect("stopped");
    let start = calls
        .find("systemctl start mosquitto")
        .expect("started again");
    assert!(stop < start, "{calls}");
}
