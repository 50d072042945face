//! Integration tests of loop-probe on real files in /dev/shm: writer and reader, hostile files,
//! the C ABI with a real C program, and allocation counting.

mod alloc;
mod bad_input;
mod c_abi;
mod file_io;
mod util;
