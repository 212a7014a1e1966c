// sqlx::migrate! embeds the migrations at compile time; without this, a new
// migration file would not rebuild the crate, and the binary would refuse a
// database that already has it.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/orders");
}
