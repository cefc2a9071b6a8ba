"""What a reader sees: summary.md, report/index.html, junit.xml, and the pages of a comparison and a
run history."""
