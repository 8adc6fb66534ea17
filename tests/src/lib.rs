pub mod faults;
pub mod moto;
pub mod process;
pub mod rustack;
pub mod server;
pub mod server_process;
