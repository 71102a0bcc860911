//! The doors suite: serial boards and OSDP readers on real pseudo-terminals
//! (testkit::board, testkit::osdp_peer), the door path's storage faults,
//! `lockhub serial-sim` and `lockhub alert clear` beside a running daemon.
//! One test binary, so the suite links once.

mod alert_clear;
mod config_change;
mod door_storage;
mod osdp;
mod osdp_keys;
mod osdp_wire;
mod schedules;
mod serial_doors;
mod serial_pairing;
mod serial_ports;
mod serial_sealed;
mod serial_sim_cli;
mod uses_kill;
