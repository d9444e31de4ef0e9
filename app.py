"""mixprec dashboard: `streamlit run app.py`. This is the frame around every page (st.navigation):
the page list, the page config, the sidebar (model, jobs, backend) and each page's title. The pages
are short scripts in views/ over core and the components in ui/; the home page is ui/home.py.
Not a `pages/` folder: Streamlit serves a `pages/` folder beside app.py as a legacy multipage app (its
scripts run without this frame) until app.py's st.navigation first runs in the server process, which
turns that off for the process (streamlit.runtime.pages_manager.PagesManager.uses_pages_directory);
views/ is a folder Streamlit never looks at, so there is no such window."""
import streamlit as st

from ui import frame, home
from ui.frame import PageInfo

HOME = PageInfo(None, "home", "Home", ":material/home:", heading="mixprec",
                caption="Sensitivity-guided mixed precision for ONNX models headed to TensorRT")
PAGES = [
    PageInfo("views/model.py", "Model", "Model", ":material/deployed_code:",
             "upload an ONNX model or pick a sample; calibration / evaluation data",
             "The model and the data every other page works on."),
    PageInfo("views/sensitivity.py", "Sensitivity", "Sensitivity", ":material/query_stats:", "layer-wise ranking against FP32",
             "How far each layer's output drifts from FP32 when every eligible layer is INT8 (ONNX Runtime, "
             "Polygraphy Comparator). Errors are cumulative; 'added_cos_drop' isolates a layer's own share, and "
             "the isolated ranking below quantizes one layer at a time."),
    PageInfo("views/precision.py", "Precision", "Precision", ":material/tune:",
             "per-layer FP32 / FP16 / INT8, bulk actions, rebuild",
             "Choose FP32 / FP16 / INT8 per layer, then Rebuild. INT8 applies to eligible layers only "
             "(MatMul, Gemm, Conv, ConvTranspose, and the residual Add, pooling and Concat placements TensorRT fuses)."),
    PageInfo("views/build_and_results.py", "Build_and_results", "Build and results", ":material/monitoring:",
             "jobs, latency, reformats, quality",
             "Builds run one at a time per backend, in child processes: a crash or a cancel never takes the "
             "dashboard down. Latency is measured interleaved against FP32 on this machine."),
    PageInfo("views/export.py", "Export", "Export", ":material/download:",
             "any run's policy, build scripts, compiled ONNX, calibration cache, bundle zip; import",
             "The session's policy or any past run's: policy JSON, build scripts for TensorRT ≤ 10.11 and ≥ 10.12, "
             "the compiled ONNX, the calibration cache and a bundle zip with a README; import a policy."),
]

page = st.navigation([HOME.page(lambda: home.page(PAGES), default=True), *(info.page() for info in PAGES)])
info = frame.current([HOME, *PAGES], page)
st.set_page_config(page_title=f"mixprec · {info.heading or info.title}", layout="wide")
frame.keep_state()
frame.sidebar()
frame.heading(info)
page.run()
