//! The command-line suite: `check-config`, `provision`, `status`, `keys`
//! and the demo example, each run as its own process on files in a
//! temporary folder. One test binary, so the suite links once.

mod config;
mod demo;
mod grammar;
mod keys_cli;
mod provision;
mod scripts;
mod status;
