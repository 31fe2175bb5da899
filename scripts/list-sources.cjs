// Lists native/*.cc for binding.gyp so a new kernel file needs no edit to the build script.
'use strict';
const fs = require('fs');
const path = require('path');
const dir = path.join(__dirname, '..', 'native');
process.stdout.write(fs.readdirSync(dir).filter((f) => f.endsWith('.cc')).sort().map((f) => 'native/' + f).join(' '));
