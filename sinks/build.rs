//! With the `torch` feature: compiles the small C++ shim `src/tensor/blob.cpp` (a tensor
//! over an Arrow buffer, with a deleter) against libtorch's headers, and adds an rpath to
//! libtorch in this package's test and example binaries so they run without
//! `LD_LIBRARY_PATH` (torch-sys tells its direct dependents where it linked libtorch from).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=src/tensor/blob.cpp");
    #[cfg(feature = "torch")]
    torch();
}

/// `cc` is a build dependency only with `torch`, so this must not be compiled without it
/// (`cargo build --no-default-features`).
#[cfg(feature = "torch")]
fn torch() {
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
    let root = std::path::PathBuf::from(
        std::env::var("LIBTORCH")
            .expect("LIBTORCH must name a libtorch directory (source scripts/libtorch.sh)"),
    );
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .file("src/tensor/blob.cpp")
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .warnings(false)
        .compile("sluice_blob");
}
