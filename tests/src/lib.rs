pub mod moto;
pub mod rustack;
pub mod server;
