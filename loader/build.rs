//! Compiles the small C++ shim `src/blob.cpp` (a tensor
//! over an Arrow buffer, with a deleter) against libtorch's headers, and adds an rpath to
//! libtorch in this package's test and example binaries so they run without
//! `LD_LIBRARY_PATH` (torch-sys tells its direct dependents where it linked libtorch from).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=src/blob.cpp");
    torch();
}

fn torch() {
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
    let root = libtorch_root();
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .file("src/blob.cpp")
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .warnings(false)
        .compile("sluice_blob");
}

/// Where libtorch's headers are, however torch-sys found libtorch: `LIBTORCH_INCLUDE` or
/// `LIBTORCH` when set (torch-sys reads them too), else next to the library directory
/// torch-sys linked (`DEP_TCH_LIBTORCH_LIB`: a libtorch download, or a pip-installed torch
/// under `LIBTORCH_USE_PYTORCH=1` — both keep `include/` beside `lib/`).
fn libtorch_root() -> std::path::PathBuf {
    println!("cargo:rerun-if-env-changed=LIBTORCH_INCLUDE");
    if let Some(dir) = std::env::var_os("LIBTORCH_INCLUDE").or_else(|| std::env::var_os("LIBTORCH"))
    {
        return dir.into();
    }
    let lib = std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(std::path::PathBuf::from);
    match lib.as_deref().and_then(std::path::Path::parent) {
        Some(root) => root.to_path_buf(),
        None => panic!(
            "cannot find libtorch's headers: torch-sys did not say where it found libtorch; set LIBTORCH (source scripts/libtorch.sh) or LIBTORCH_USE_PYTORCH=1 with torch installed in python"
        ),
    }
}
