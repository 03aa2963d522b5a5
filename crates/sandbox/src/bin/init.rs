//! The sandbox init program (PID 1 inside every sandbox). See `tessera_sandbox::init`.
fn main() {
    tessera_sandbox::init::main()
}
