//! `sqs-flight`: the command-line client; the program is
//! [`sqs_flight_client::cli`].

fn main() -> std::process::ExitCode {
    sqs_flight_client::cli::main()
}
