//! The README's Rust examples are doc tests (see `ReadmeDoctests` in the crate root), so
//! they compile and run. This checks that what a reader sees is what those tests run: every
//! Rust block is a whole program that compiles when pasted into a new binary crate, with no
//! lines hidden by rustdoc.

/// The README's fenced Rust blocks, with the line each starts on.
fn rust_blocks(readme: &str) -> Vec<(usize, Vec<&str>)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, Vec<&str>)> = None;
    for (number, line) in readme.lines().enumerate() {
        match current.as_mut() {
            None if line.trim_start().starts_with("```rust") => {
                current = Some((number + 1, vec![]))
            }
            None => {}
            Some(_) if line.trim_start().starts_with("```") => blocks.extend(current.take()),
            Some((_, lines)) => lines.push(line),
        }
    }
    assert!(current.is_none(), "a Rust block is never closed");
    blocks
}

#[test]
fn every_readme_example_is_a_whole_program_with_nothing_hidden() {
    let readme = include_str!("../../README.md");
    let blocks = rust_blocks(readme);
    assert!(blocks.len() >= 2, "the README's examples went missing");
    for (start, lines) in blocks {
        // rustdoc hides a line that is `#` alone or starts with `# `.
        for line in &lines {
            let trimmed = line.trim_start();
            assert!(
                trimmed != "#" && !trimmed.starts_with("# "),
                "README line {start}+: rustdoc would hide {line:?} from the reader"
            );
        }
        let text = lines.join("\n");
        assert!(
            text.contains("fn main()"),
            "the README block at line {start} is not a whole program: it needs a fn main"
        );
        if text.contains('?') {
            assert!(
                text.contains("fn main() -> Result<"),
                "the README block at line {start} uses `?` outside a fn main returning Result"
            );
        }
    }
}

#[test]
fn hidden_lines_and_fragments_are_caught() {
    let hidden = "```rust\nfn main() {}\n# let x = 1;\n```\n";
    let blocks = rust_blocks(hidden);
    assert_eq!(blocks.len(), 1);
    assert!(blocks[0].1.iter().any(|line| line.starts_with("# ")));
    let fragment = "text\n```rust\nlet x = 1;\n```\n```sh\nls\n```\n";
    let blocks = rust_blocks(fragment);
    assert_eq!(blocks, vec![(2, vec!["let x = 1;"])]);
}
