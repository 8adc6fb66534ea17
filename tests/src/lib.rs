pub mod moto;
pub mod process;
pub mod rustack;
pub mod server;
