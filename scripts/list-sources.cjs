// Lists native/**/*.cc for binding.gyp so a new kernel file needs no edit to the build script.
// Subfolders (native/common/, native/index/, ...) are included; every file includes headers by their
// path under native/ ("common/args.h"), the one include directory.
'use strict';
const fs = require('fs');
const path = require('path');
const root = path.join(__dirname, '..', 'native');
function walk(dir, rel) {
  return fs
    .readdirSync(dir, { withFileTypes: true })
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
    .flatMap((e) => (e.isDirectory() ? walk(path.join(dir, e.name), rel + e.name + '/') : e.name.endsWith('.cc') ? [rel + e.name] : []));
}
process.stdout.write(walk(root, 'native/').join(' '));
