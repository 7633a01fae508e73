//! TEMPORARY: stands in for the contracts crate's phase model and prep
//! validation until they land; removed when they do.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase { P0, P1, P2, P3, P4, P5, P6, P7, P8, P9, P10, P11 }

impl Phase {
    pub fn id(self) -> &'static str {
        ["P0","P1","P2","P3","P4","P5","P6","P7","P8","P9","P10","P11"][self as usize]
    }
}

#[derive(Debug)]
pub struct F { pub field: String, pub message: String }

pub fn validate_prep_text(_t: &str) -> Vec<F> { Vec::new() }
