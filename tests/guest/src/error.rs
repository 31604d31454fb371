//! The test guest's error type.

use std::io;

use vhost_user_rdma::abi::Status;

#[derive(Debug)]
pub enum Error {
    Io(io::Error),
    Vhost(vhost::Error),
    /// The device answered with a non-OK status.
    Status(Status),
    /// The device returned an unknown status code.
    BadStatus(u32),
    Timeout(&'static str),
    NoMemory,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
impl std::error::Error for Error {}
impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}
impl From<vhost::Error> for Error {
    fn from(e: vhost::Error) -> Self {
        Error::Vhost(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;
