//! The `weir` binary: the command line lives in `weir::cli`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    weir::cli::main()
}
