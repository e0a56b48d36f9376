//! `heap::one_arena`: a thread started after it allocates from the main
//! heap (the `[heap]` mapping grows), where without it the thread gets an
//! arena of its own (a separate mapping, and `[heap]` stays as it was).
//! Its own process (no test harness): glibc's arenas are per process and
//! the harness's threads would have made some already. The control
//! (without the call) runs in a second process, this program started
//! again with `ONE_ARENA_OFF` set, so that the call made here cannot
//! reach it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Size of the main heap (`[heap]` in /proc/self/maps), in bytes.
fn main_heap() -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines()
        .filter(|l| l.ends_with("[heap]"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some(usize::from_str_radix(b, 16).ok()? - usize::from_str_radix(a, 16).ok()?)
        })
        .sum()
}

/// Allocates 16 MiB on a new thread; panics unless the main heap grew as
/// `one` says it should.
fn measure(one: bool) {
    if one {
        assert!(sluice_ffi::heap::one_arena(), "glibc refused M_ARENA_MAX");
    }
    let before = main_heap();
    // 16 MiB in 64 KiB blocks (below the mmap threshold: they come from an
    // arena), kept alive until measured.
    let blocks = std::thread::spawn(|| (0..256).map(|i| vec![u8::try_from(i % 251).unwrap(); 64 << 10]).collect::<Vec<_>>()).join().unwrap();
    let after = main_heap();
    let grew = after.saturating_sub(before);
    println!("main heap {before} -> {after} bytes (one arena: {one})");
    if one {
        assert!(grew >= 16 << 20, "the thread's 16 MiB did not come from the main heap: it grew by {grew} bytes");
    } else {
        assert!(grew < 8 << 20, "without one_arena the thread should have had an arena of its own: the main heap grew by {grew} bytes");
    }
    assert_eq!(blocks.len(), 256);
}

fn main() {
    if std::env::var_os("ONE_ARENA_OFF").is_some() {
        measure(false);
        return;
    }
    measure(true);
    // The control: the same program without the call, in a fresh process.
    let exe = std::env::current_exe().expect("this test's executable");
    let control = std::process::Command::new(exe)
        .env("ONE_ARENA_OFF", "1")
        .env_remove("MALLOC_ARENA_MAX")
        .output()
        .expect("start the control process");
    let out = String::from_utf8_lossy(&control.stdout);
    print!("control: {out}");
    assert!(
        control.status.success() && out.contains("(one arena: false)"),
        "the control without one_arena failed ({}):\n{out}{}",
        control.status,
        String::from_utf8_lossy(&control.stderr)
    );
    println!("test one_arena ... ok");
}
