//! The borrowed parse never allocates, proved with a counting global allocator.
//!
//! Counts are per thread, so the test harness's own threads cannot disturb them.

use std::hint::black_box;

use edgewatch_test_kit::alloc::CountingAllocator;

#[path = "integration/fixtures.rs"]
#[allow(dead_code)]
mod fixtures;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

#[test]
fn the_counting_allocator_sees_an_allocation() {
    let (n, ()) = ALLOCATOR.allocations_during(|| {
        black_box(vec![1u8; 16]);
    });
    assert_eq!(n, 1);
}

#[test]
fn parsing_every_capture_line_and_reading_every_field_allocates_nothing() {
    let captures = fixtures::captures();
    for c in &captures {
        let (n, ()) = ALLOCATOR.allocations_during(|| {
            let sample = tegrastats_parser::parse_line(black_box(&c.line)).unwrap();
            // Read every field too: the accessors and the GPU summary must not allocate either.
            black_box(sample.gpu());
            black_box(sample.cpus().iter().filter(|cpu| cpu.online).count());
            black_box(
                sample
                    .temperatures()
                    .iter()
                    .filter_map(|t| t.celsius)
                    .sum::<f32>(),
            );
            black_box(sample.rails().iter().map(|r| r.current_mw).sum::<u32>());
            black_box(sample.engines().len() + sample.unknown().len());
            black_box(sample);
        });
        assert_eq!(n, 0, "{} allocated {n} times", c.origin());
    }
}

#[test]
fn rejected_and_garbled_lines_allocate_nothing_either() {
    let lines = [
        "",
        "Mon Dec 14 10:00:00 PST 2020",
        "10-16-2023 10:59:22 RAM 1205/",
        "RAM 1/2MB (lfb 1x4 FOO [1,2] cpu@-256C/40C VIN 87426mW/43713mW/87426mW GR3D_FREQ @[1,2,3,4,5,6,7,8,9]",
        "«é» RAM 1/x",
    ];
    for line in lines {
        let (n, ()) = ALLOCATOR.allocations_during(|| {
            let _ = black_box(tegrastats_parser::parse_line(black_box(line)));
        });
        assert_eq!(n, 0, "{line:?} allocated {n} times");
    }
}
