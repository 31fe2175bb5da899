// Prints "true" when liburing's header and library are present, so binding.gyp can build the
// io_uring engine; the addon still falls back to pread at run time when the kernel refuses io_uring.
'use strict';
const fs = require('fs');
const { execSync } = require('child_process');
function found() {
  if (process.env.KVDRIVE_NO_LIBURING === '1') return false;
  const headers = ['/usr/include/liburing.h', '/usr/local/include/liburing.h'];
  if (!headers.some((h) => fs.existsSync(h))) return false;
  try {
    execSync('echo "int main(){return 0;}" | ${CXX:-g++} -x c++ - -luring -o /dev/null', { stdio: 'ignore', shell: '/bin/sh' });
    return true;
  } catch {
    return false;
  }
}
process.stdout.write(found() ? 'true' : 'false');
