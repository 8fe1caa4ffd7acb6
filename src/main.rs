fn main() {
    println!("tapegate");
}
