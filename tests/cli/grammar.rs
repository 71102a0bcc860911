//! One grammar for every command (issue 25): each takes `--config FILE`
//! with the default `/etc/lockhub/hub.toml`, every option has help text,
//! the global flags are listed once under their own heading, and
//! `check-config`'s positional FILE is an alias of `--config`.

use std::process::{Command, Output};
use testkit::files::Fixture;

const BIN: &str = env!("CARGO_BIN_EXE_lockhub");

fn lockhub(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run lockhub")
}

fn help(path: &[&str]) -> String {
    let mut args = path.to_vec();
    args.push("--help");
    let out = lockhub(&args);
    assert!(out.status.success(), "lockhub {path:?} --help");
    String::from_utf8(out.stdout).unwrap()
}

/// The lines of `section` (`Commands:`, `Options:`, `Global options:`).
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect()
}

/// Every command that does something (`lockhub alert clear`, ...), found by
/// walking `--help`, so a command added later is checked too.
fn leaf_commands(path: Vec<String>) -> Vec<Vec<String>> {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let text = help(&args);
    let subs: Vec<String> = section(&text, "Commands:")
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect();
    if subs.is_empty() {
        return vec![path];
    }
    subs.into_iter()
        .flat_map(|s| {
            let mut p = path.clone();
            p.push(s);
            leaf_commands(p)
        })
        .collect()
}

#[test]
fn every_command_takes_config_with_one_default_and_every_option_says_what_it_is_for() {
    let commands = leaf_commands(vec![]);
    assert!(commands.len() >= 8, "{commands:?}");
    for cmd in &commands {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let text = help(&args);
        let options = section(&text, "Options:");
        for line in &options {
            // `  --flag <VALUE>  Help text`: a flag column, then its text.
            let described = line
                .trim_start()
                .split("  ")
                .filter(|part| !part.trim().is_empty())
                .count()
                >= 2;
            assert!(
                described,
                "lockhub {cmd:?}: an option without help: {line:?}"
            );
        }
        // sim-board plays a lock board: it reads no hub config.
        if cmd[0] != "sim-board" {
            let config = options
                .iter()
                .find(|l| l.trim_start().starts_with("--config <FILE>"))
                .unwrap_or_else(|| panic!("lockhub {cmd:?} has no --config FILE:\n{text}"));
            assert!(
                config.contains("[default: /etc/lockhub/hub.toml]"),
                "lockhub {cmd:?}: {config}"
            );
        }
        // The global flags: once, under their own heading, not among the
        // command's options.
        assert!(
            options.iter().all(|l| !l.contains("--log-")),
            "lockhub {cmd:?} mixes the global flags into its options:\n{text}"
        );
        let global = section(&text, "Global options:");
        for flag in ["--log-format", "--log-level"] {
            assert_eq!(
                global.iter().filter(|l| l.contains(flag)).count(),
                1,
                "lockhub {cmd:?}: {flag}\n{text}"
            );
            assert_eq!(text.matches(flag).count(), 1, "lockhub {cmd:?}: {flag}");
        }
    }
}

#[test]
fn check_config_takes_its_file_as_config_or_positionally_but_not_both() {
    let fx = Fixture::new();
    let hub = fx.hub();
    let hub = hub.to_str().unwrap();
    for args in [
        vec!["check-config", hub],
        vec!["check-config", "--config", hub],
    ] {
        let out = lockhub(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{hub}: ok\n"));
    }
    let out = lockhub(&["check-config", hub, "--config", hub]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

#[test]
fn without_config_every_reading_command_looks_at_etc_lockhub_hub_toml() {
    if std::path::Path::new("/etc/lockhub/hub.toml").exists() {
        eprintln!("this machine has /etc/lockhub/hub.toml: not testing its absence");
        return;
    }
    for args in [
        vec!["check-config"],
        vec!["keys"],
        vec!["status"],
        vec!["alert", "clear", "tamper", "board-a", "--reason", "test"],
        vec!["osdp", "install", "--reader", "r-1"],
    ] {
        let out = lockhub(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("/etc/lockhub/hub.toml"), "{args:?}: {err}");
    }
}

fn fleet_status(args: &[&str]) -> Output {
    Command::new("python3")
        .arg(testkit::repo_root().join("docs/fleet-status.py"))
        .args(args)
        .output()
        .expect("run python3")
}

#[test]
fn fleet_status_answers_help_and_hands_every_other_flag_to_mosquitto_sub() {
    let out = fleet_status(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for said in ["--follow", "--stale-after", "--prefix", "mosquitto_sub"] {
        assert!(text.contains(said), "{text}");
    }
    // -h is mosquitto_sub's host, as in docs/broker.md's example.
    let broker = testkit::broker::Mosquitto::start();
    let port = broker.port.to_string();
    let out = fleet_status(&["-h", "127.0.0.1", "-p", &port]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("0 hubs, 0 unhealthy"), "{err}");
}
