//! `cargo bench --bench lockhub [-- --smoke] [--only SCENARIO,..] [--write PATH | --no-write]`
//!
//! Runs the lockhub benchmarks, prints every figure, and updates the figures
//! table in BENCHMARKS.md (see `harness/mod.rs` for why this is a bench target
//! and the harness a library).

fn main() -> std::process::ExitCode {
    let opts = match harness::Options::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("lockhub bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let figures = harness::run(&opts);
    if let Some(path) = &opts.write {
        match harness::report::update_file(path, &figures, &harness::stamp(), harness::SKELETON) {
            Ok(()) => println!("updated {}", path.display()),
            Err(e) => {
                eprintln!("cannot write {}: {e}", path.display());
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}
