{
  "variables": {
    "kvd_liburing%": "<!(node scripts/detect-liburing.cjs)"
  },
  "targets": [
    {
      "target_name": "kvdrive",
      "sources": ["<!@(node scripts/list-sources.cjs)"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")", "native"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17"],
      "cflags_cc": ["-std=c++17", "-O3", "-fexceptions", "-Wall", "-Wno-unused-function", "-fno-math-errno"],
      "conditions": [
        ["kvd_liburing=='true'", {
          "defines": ["KVD_HAVE_LIBURING=1"],
          "libraries": ["-luring"]
        }]
      ]
    }
  ]
}
