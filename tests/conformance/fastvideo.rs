//! FastVideo's real port folders laid out as a checkout: `fvd init` and
//! `fvd submit` of every family on a machine without torch keep every
//! porter's record byte for byte (issue #11's measurement, now a check).

use crate::checks::fastvideo::{WithoutTorch, checkout, submits_without_torch_keep_the_record};

#[test]
fn every_real_family_inits_and_submits_without_torch_and_keeps_the_porters_record() {
    let repo_dir = checkout(&crate::real().join("fastvideo"));
    submits_without_torch_keep_the_record(
        repo_dir.path(),
        // flux's record names a transformer test of FastVideo's own tree
        &["fastvideo/tests/transformers/test_flux.py"],
        &[
            ("dreamx_world", WithoutTorch::WaitsForTorch),
            ("flux", WithoutTorch::WaitsForTorch),
            ("lingbotworld2", WithoutTorch::RefusedAtP0),
            // every ltx2 test needs CUDA
            ("ltx2", WithoutTorch::NeedsAGpu),
        ],
    );
}
