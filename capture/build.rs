// See packaging/source_commit.rs: names the commit this crate was built from.
include!("../packaging/source_commit.rs");
