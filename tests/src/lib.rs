pub mod moto;
pub mod server;
