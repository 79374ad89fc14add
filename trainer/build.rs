//! An rpath to libtorch in this package's test binaries, so they run without
//! `LD_LIBRARY_PATH` (torch-sys tells its direct dependents where it linked libtorch from).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
